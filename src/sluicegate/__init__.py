"""sluicegate: an async, OpenAI-compatible inference gateway over an in-process vLLM engine."""

__version__ = "0.1.0"
