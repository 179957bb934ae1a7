"""Browsers: which web origins may call the API (CORS), and the playground page."""

from __future__ import annotations

import re

from pydantic import BaseModel, Field, field_validator

_ORIGIN = re.compile(r"https?://(\[[0-9a-fA-F:.]+\]|[^/\s:\[\]]+)(:\d{1,5})?")


class BrowserSettings(BaseModel):
    """What pages in a browser may do."""

    # --- browsers ---------------------------------------------------------------------
    cors_allow_origins: str = Field(
        default="",
        description="Comma-separated origins (`https://app.example.com`) whose pages may call "
        "the API from a browser; `*` allows any. Empty: CORS off, browsers block other "
        "origins' pages.",
    )
    playground: bool | None = Field(
        default=None,
        description="Serve the streaming playground page at /playground. Unset: on when "
        "HOST is a loopback address, off otherwise.",
    )

    @field_validator("cors_allow_origins")
    @classmethod
    def _origins_parse(cls, value: str) -> str:
        for origin in (o.strip() for o in value.split(",")):
            if origin and origin != "*" and not _ORIGIN.fullmatch(origin.rstrip("/")):
                raise ValueError(
                    f"{origin!r} is not an origin: write scheme://host[:port], "
                    "as a browser sends it in the Origin header"
                )
        return value

    @property
    def cors_origins(self) -> list[str]:
        return [o.strip().rstrip("/") for o in self.cors_allow_origins.split(",") if o.strip()]
