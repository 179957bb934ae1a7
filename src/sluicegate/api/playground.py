"""`GET /playground`: a page that streams completions, from files shipped in the package.

Starlette's `StaticFiles` serves them (off the event loop, with ETags); there is no build step
and nothing is fetched from a CDN. The page calls the API like any other client, with the key
typed into it.
"""

from __future__ import annotations

from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from sluicegate.paths import PLAYGROUND_PATH


def playground_mount() -> Mount:
    files = StaticFiles(packages=[("sluicegate", "playground")], html=True)
    return Mount(PLAYGROUND_PATH, app=files, name="playground")
