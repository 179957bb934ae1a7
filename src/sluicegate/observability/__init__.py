"""Metrics declared once (`metrics`), the per-request access-log record (`record`),
OpenTelemetry tracing (`tracing`), log formats (`logs`) and throttled warnings
(`throttled`). The middleware that feeds them is `http.telemetry`; the telemetry of each
engine run is `inference.telemetry`."""
