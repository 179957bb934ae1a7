"""Everything that touches ASGI's scope, receive and send.

The middleware, in request order (the list in `app.py`): `request_id`, `telemetry`, `auth`,
`admission`, `body_limits`, `cache_hits`. Beside them: `sse` (the event-stream response),
`disconnect` (abort on disconnect), `errors` (the error renderers), `state` (what the lifespan
hands to requests) and `asgi` (small helpers on scopes and bodies)."""
