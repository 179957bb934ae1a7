"""Upstream mode: remote OpenAI-compatible servers behind the engine protocol.

engine.UpstreamEngine      the EngineClient: picks, retries, streams, settles usage
├── balancer.Balancer      least outstanding requests (power of two choices), prefix affinity
├── server.Upstream        one server: its pooled httpx client, breaker, health, in-flight
│   └── breaker.Breaker    closed / open / half-open, on consecutive failures and error ratio
├── retry.RetryBudget      retries at most a share of requests, backoff with full jitter
├── wire                   our prompt and options as an OpenAI body; its SSE as engine steps
├── tool_calls             upstream tool calls carried through the text-based tool pipeline
└── tokenizer              the token budget's counts from an upstream's `/tokenize`
"""
