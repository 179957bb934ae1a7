"""Metrics (and, later, tracing and logs)."""
