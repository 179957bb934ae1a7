"""Server and workers: the address bound, the worker processes, connections, shutdown,
the check of unknown settings, and logs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from sluicegate.observability.logs import LogFormat


class ServerSettings(BaseModel):
    """The server process and its workers."""

    # --- server ----------------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="Address to bind.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port to bind.")
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Front-end processes sharing the port, each with its own event loop; with "
        "the in-process engine, each is a client of one engine core (vLLM's "
        "--api-server-count). Above 1 the bounds on requests in flight and per-key shares hold "
        "for all of them, and REDIS_URL is required (see docs/operations.md).",
    )
    worker_stall_timeout: float = Field(
        default=30.0,
        gt=0,
        description="With WORKERS above 1: seconds a serving worker's event loop may go "
        "without a turn (stuck in a call that never yields, or stopped) before the supervisor "
        "kills it; the other workers then drain and the gateway exits, as when a worker dies "
        "(docs/operations.md).",
    )
    shutdown_timeout: float = Field(
        default=30.0,
        ge=0,
        description="Seconds in-flight requests may take to finish after SIGTERM.",
    )
    exit_on_engine_death: bool = Field(
        default=True,
        description="When the engine core dies, drain (new requests get 503) and exit with "
        "code 3, so Docker, compose or Kubernetes restart the gateway. `false`: stay up and "
        "answer 503 `engine_unavailable` until restarted by hand.",
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        description="Connections served at once, counted as they are accepted: a request on a "
        "connection past them gets a 503 `overloaded` (with Retry-After) and the connection "
        "closes; those accepted first are served. Keep it below the open-file limit "
        "(`ulimit -n`).",
    )
    backlog: int = Field(
        default=2048,
        ge=1,
        description="Connections the kernel queues before the server accepts them.",
    )
    keep_alive_timeout: int = Field(
        default=5,
        ge=1,
        description="Seconds an idle kept-alive connection stays open.",
    )
    request_head_timeout: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a request's line and headers may take to arrive, from the "
        "connection (or the first byte of a later request on it); then the connection is "
        "closed, with a 408 if the head had begun.",
    )
    allow_unknown_settings: bool = Field(
        default=False,
        description="Start even when the environment or the `.env` file holds a "
        "`SLUICEGATE_*` name that is no setting (a typo, or a setting of another version), "
        "with a warning for each. Off: such a name stops start-up, naming the closest setting.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level."
    )
    log_format: LogFormat = Field(
        default="plain",
        description="`plain` lines, or one JSON object per line (ours and uvicorn's logs, "
        "including the access log).",
    )
