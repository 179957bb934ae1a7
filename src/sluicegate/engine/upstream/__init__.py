"""Upstream mode: remote OpenAI-compatible servers behind the engine protocol.

engine.UpstreamEngine      the EngineClient: composes the modules below, builds the bodies
├── pool.Pool              the upstreams of one model: health probes, in and out, `/ready`
│   └── server.Upstream    one server: its pooled httpx client, breaker, health, in-flight
│       └── breaker.Breaker  closed / open / half-open, on consecutive failures and error ratio
├── dispatcher.Dispatcher  requests out: the pick, the send, the retries before any output
│   ├── balancer.Balancer  least outstanding requests (power of two choices), prefix affinity
│   ├── retry.RetryBudget  retries at most a share of requests, backoff with full jitter
│   └── exchange.Exchange  one try on one upstream: its failure, its end, its counts
├── stream                 the answer's body read into engine steps, the try settled at its end
├── discovery              the model and listings found at start-up and with each probe
├── wire                   our prompt and options as an OpenAI body; its SSE as engine steps
├── tool_calls             upstream tool calls carried through the text-based tool pipeline
└── tokenizer              the token budget's counts: local, or an upstream's `/tokenize`
"""
