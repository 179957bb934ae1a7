"""From a validated request to engine runs and what they produce, with no HTTP and no
Settings: the service (`service`, `run`), the token budget (`budget`, `truncation`) and the
telemetry of each engine run (`telemetry`)."""
