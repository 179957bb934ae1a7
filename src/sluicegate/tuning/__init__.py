"""`sluicegate tune` and its traffic profiles (docs/tuning.md). Loaded by the command line
alone: nothing of the gateway's request path imports it."""
