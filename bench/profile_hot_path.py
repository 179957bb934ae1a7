"""Where the gateway's CPU goes on its hot paths: py-spy samples a real gateway under load.

Three paths, each a `sluicegate serve` process loaded by this script (aiohttp on uvloop, a
process of its own) while `py-spy record` samples the gateway's main thread:

- upstream: streamed chats (32 chunks) from the fast fault upstream (tests/support/
  fault_upstream.py, no delay), the response cache off: the pass-through path;
- cache: the same gateway with the response cache on (`CACHE_POLICY=all`, its in-process
  store or `--redis-url`), every request a hit on one of 16 seeded prompts, half streamed;
- engine: streamed chats of 64 tokens from the real in-process engine (the bundled model;
  with `--reasoning`, its reasoning variant, split by vLLM's `step3` parser).

For each, the top functions by own samples and by samples under them (the share of all of
the process's samples), and the collapsed stacks in bench/results/ for a flame graph
(`flamegraph.pl` or speedscope take them as they are).

    .venv/bin/python bench/profile_hot_path.py                      # all three, 20 s each
    .venv/bin/python bench/profile_hot_path.py --paths upstream --seconds 30
    .venv/bin/python bench/profile_hot_path.py --paths engine --reasoning
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.fault_upstream import start as start_upstream  # noqa: E402
from tests.support.gateway import MODEL_NAME, start_gateway  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PATHS = ("upstream", "cache", "engine")


def chat(model: str, index: int, stream: bool, max_tokens: int) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"Tell me about sluice gates ({index})."}],
        "stream": stream,
        "max_tokens": max_tokens,
        "temperature": 0,
    }


async def load(url: str, bodies: list[dict[str, object]], concurrency: int, seconds: float) -> int:
    """Requests from `concurrency` workers, round robin over `bodies`, for `seconds`; how many
    were answered (each read to its end; any status but 200 stops the run)."""
    done = 0
    end = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:

        async def worker(offset: int) -> None:
            nonlocal done
            i = offset
            while time.monotonic() < end:
                async with http.post(url, json=bodies[i % len(bodies)]) as reply:
                    if reply.status != 200:
                        raise SystemExit(f"{url}: {reply.status} {await reply.text()}")
                    await reply.read()
                done += 1
                i += concurrency

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return done


def profile(pid: int, name: str, seconds: float, rate: int) -> tuple[subprocess.Popen[bytes], Path]:
    """py-spy recording `pid`'s collapsed stacks for `seconds`, from now, and their file."""
    out = RESULTS / f"profile-{name}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    command = [
        str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
        "--duration", str(int(seconds)), "--rate", str(rate), "--format", "raw",
        "--nonblocking", "--output", str(out),
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL), out


def summary(collapsed: Path, top: int) -> str:
    """The top functions by own and by inclusive samples, as Markdown tables."""
    own: collections.Counter[str] = collections.Counter()
    under: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        frames = [_short(f) for f in stack.split(";")[1:]]  # the first is the thread
        total += samples
        if frames:
            own[frames[-1]] += samples
        for frame in set(frames):
            under[frame] += samples
    lines = [f"{total} samples", ""]
    for title, counter in (("own", own), ("inclusive", under)):
        lines += [f"| function ({title}) | share |", "|---|---|"]
        lines += [f"| `{f}` | {100 * n / total:.1f}% |" for f, n in counter.most_common(top)]
        lines.append("")
    return "\n".join(lines)


def _short(frame: str) -> str:
    """`function (path/to/module.py:line)` as `function (module path from its package root)`."""
    name, _, where = frame.partition(" (")
    path = _ROOTS.sub("", where.rstrip(")").rsplit(":", 1)[0])
    return f"{name} ({path})"


_ROOTS = re.compile(r"^.*?(site-packages/|/src/|^src/|/python3\.\d+/|^lib/python3\.\d+/)")


def run(
    name: str, url: str, pid: int, bodies: list[dict[str, object]], args: argparse.Namespace
) -> str:
    import uvloop

    uvloop.run(load(url, bodies, args.concurrency, 3))  # warm
    recording, collapsed = profile(pid, name, args.seconds, args.rate)
    served = uvloop.run(load(url, bodies, args.concurrency, args.seconds))
    recording.wait()
    rate = served / args.seconds
    heading = f"### {name}: {rate:.0f} req/s at concurrency {args.concurrency}"
    return f"{heading}\n\n{summary(collapsed, args.top)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rate", type=int, default=250, help="samples a second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--redis-url", default=None)
    parser.add_argument(
        "--reasoning",
        action="store_true",
        help="the engine path serves the reasoning variant of the bundled model, split",
    )
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    reports = []
    with tempfile.TemporaryDirectory() as folder:
        logs = Path(folder)
        upstream = start_upstream(0, "--chunks", "32", "--delay", "0", log=logs / "up.log")
        try:
            for name in args.paths:
                env = {"SLUICEGATE_CACHE_POLICY": "off"}
                if name != "engine":
                    env["SLUICEGATE_UPSTREAM_URLS"] = upstream.url
                if name == "engine" and args.reasoning:
                    from tests.support.reasoning_model import (
                        PARSER,
                        TEMPLATE_FILE,
                        reasoning_model,
                    )

                    folder = reasoning_model()
                    env["SLUICEGATE_MODEL"] = str(folder)
                    env["SLUICEGATE_SERVED_MODEL_NAME"] = MODEL_NAME
                    env["SLUICEGATE_REASONING_PARSER"] = PARSER
                    env["SLUICEGATE_CHAT_TEMPLATE"] = str(folder / TEMPLATE_FILE)
                if name == "cache":
                    env["SLUICEGATE_CACHE_POLICY"] = "all"
                    if args.redis_url:
                        env["SLUICEGATE_REDIS_URL"] = args.redis_url
                gateway = start_gateway(logs, env=env)
                try:
                    model = "fault-model" if name != "engine" else MODEL_NAME
                    url = gateway.url + "/v1/chat/completions"
                    if name == "upstream":
                        bodies = [chat(model, i, True, 32) for i in range(64)]
                    elif name == "cache":
                        bodies = [chat(model, i, i % 2 == 0, 32) for i in range(16)]
                    else:
                        bodies = [chat(model, i, True, 64) for i in range(64)]
                    reports.append(run(name, url, gateway.process.pid, bodies, args))
                finally:
                    gateway.stop()
        finally:
            upstream.stop()
    report = "\n".join(reports)
    print(report)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"profile-hot-path-{stamp}.md").write_text(report + "\n")
    (RESULTS / f"profile-hot-path-{stamp}.json").write_text(json.dumps(vars(args)))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))
    main()
