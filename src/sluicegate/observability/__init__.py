"""Metrics (`metrics`), per-request telemetry and the access log (`middleware`, `record`),
engine-run telemetry (`generation`), OpenTelemetry tracing (`tracing`) and log formats
(`logs`)."""
