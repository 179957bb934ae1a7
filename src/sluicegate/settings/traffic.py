"""The traffic: a profile recorded from live requests, for `sluicegate tune`
(`observability.capture`, docs/tuning.md#capturing), and the objective it is held to
(`observability.objective`: the dashboard's attainment)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class TrafficSettings(BaseModel):
    """Where and how much of the traffic is recorded, and the objective it is held to."""

    # --- traffic capture ---------------------------------------------------------------
    traffic_capture: Path | None = Field(
        default=None,
        description="Record a traffic profile of the requests served to this file (a line "
        "per engine sequence: times, token counts, prefix blocks as numbers; never text, "
        "token ids, keys or addresses), for `sluicegate tune`. The file must not exist; it is "
        "created readable by the gateway's user only. One worker only (WORKERS=1): each "
        "would write its own arrival order. Unset: nothing is recorded.",
    )
    traffic_capture_sample: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="The share of requests the capture records, each drawn at random on "
        "arrival (0: none, only the header is written).",
    )
    traffic_capture_max_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=4096,
        description="Bytes the capture's file may reach; past them, later requests are not "
        "recorded (with one warning).",
    )

    # --- service objective -------------------------------------------------------------
    slo_ttft: float | None = Field(
        default=None,
        gt=0,
        description="Seconds: a request meets the service objective when its first token "
        "(or byte) comes within them of its arrival, and, with SLO_ITL, its own 90th "
        "percentile gap between tokens is within that. Each inference request is counted in "
        "sluicegate_objective_requests_total{outcome=met|missed|refused} (the dashboard's "
        "attainment). The objective `sluicegate tune --slo` tuned for. Unset: not counted.",
    )
    slo_itl: float | None = Field(
        default=None,
        gt=0,
        description="Seconds: the service objective's bound on a request's own 90th "
        "percentile gap between tokens (needs SLO_TTFT).",
    )
