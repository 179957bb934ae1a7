"""OpenAI's wire format, with no I/O: the request schema (`requests`), what a run produced
(`completion`), response bodies and chunks (`formats`) and SSE events (`events`)."""
