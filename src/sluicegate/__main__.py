# The guard matters: vLLM starts its engine core in a spawned process, which re-imports
# the main module.
from sluicegate.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
