#!/usr/bin/env python3
"""Container health check: exit 0 when the gateway's `/ready` answers 200, else 1.

Standard library only, so the runtime images need neither curl nor wget. It asks the port in
SLUICEGATE_PORT (default 8000) on the loopback interface; `/ready` needs no API key.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 4.0


def main() -> int:
    port = os.environ.get("SLUICEGATE_PORT", "8000")
    url = f"http://127.0.0.1:{port}/ready"
    # No proxy: HTTP(S)_PROXY in the container's environment must not divert a loopback call.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=TIMEOUT_S) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, ValueError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"{url}: HTTP {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
