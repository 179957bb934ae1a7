"""Run the test tiers one after another, each over parallel pytest processes, and print how long
each took at the end, so a growing suite shows (docs/testing.md#tiers).

    python scripts/test_tiers.py unit integration [--workers 2] [--integration-workers 0]
        [-- pytest args...]

Every tier runs even when an earlier one fails; the exit status is the first failure's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

TIERS = {
    # Test functions spread over the workers; each worker starts its own Redis.
    "unit": ["-m", "unit", "--dist", "worksteal"],
    # Whole files to one worker: a module's gateway (one engine each) starts once, and the
    # session gateway once per worker.
    "integration": ["-m", "integration", "--dist", "loadfile"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tiers", nargs="+", choices=list(TIERS))
    parser.add_argument("--workers", default="2", help="pytest-xdist processes for the unit tier")
    parser.add_argument(
        "--integration-workers",
        default="0",
        help="pytest-xdist processes for the integration tier; 0, in pytest's own process, by "
        "default: its engines are CPU-bound and hold about 4 GB each, and two workers on two "
        "cores ran no faster than one and ran out of memory",
    )
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    results: list[tuple[str, int, float]] = []
    for name in args.tiers:
        workers = args.integration_workers if name == "integration" else args.workers
        command = [sys.executable, "-m", "pytest", "-n", workers, *TIERS[name], *extra]
        print(f"== tier {name}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        code = subprocess.call(command)
        results.append((name, code, time.monotonic() - started))
    print("\n| tier | result | minutes |\n|---|---|---|")
    for name, code, seconds in results:
        print(f"| {name} | {'passed' if code == 0 else f'failed ({code})'} | {seconds / 60:.1f} |")
    print(f"| all | | {sum(s for *_, s in results) / 60:.1f} |", flush=True)
    return next((code for _, code, _ in results if code), 0)


if __name__ == "__main__":
    sys.exit(main())
