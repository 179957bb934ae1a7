"""Typed access to what the lifespan opened (FastAPI `Annotated` dependencies).

Every dependency is `async def`, even though none awaits: FastAPI runs plain `def`
dependencies in its thread pool, a thread hop per dependency per request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sluicegate.cache import ResponseCache
from sluicegate.engine.protocol import EngineClient
from sluicegate.lifecycle import Lifecycle
from sluicegate.quota import ANONYMOUS, Quotas
from sluicegate.service import CompletionService
from sluicegate.settings import Settings


async def get_service(request: Request) -> CompletionService:
    service: CompletionService = request.state.service
    return service


async def get_engine(request: Request) -> EngineClient:
    engine: EngineClient = request.state.engine
    return engine


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.state.settings
    return settings


async def get_started_at(request: Request) -> int:
    started_at: int = request.state.started_at
    return started_at


async def get_lifecycle(request: Request) -> Lifecycle:
    lifecycle: Lifecycle = request.state.lifecycle
    return lifecycle


async def get_quotas(request: Request) -> Quotas:
    quotas: Quotas = request.state.quotas
    return quotas


async def get_cache(request: Request) -> ResponseCache:
    cache: ResponseCache = request.state.cache
    return cache


async def get_key_id(request: Request) -> str:
    """The caller's public key id, or `anonymous` when the gateway has no API keys."""
    key_id: str = getattr(request.state, "api_key_id", ANONYMOUS)
    return key_id


ServiceDep = Annotated[CompletionService, Depends(get_service)]
EngineDep = Annotated[EngineClient, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
StartedAtDep = Annotated[int, Depends(get_started_at)]
LifecycleDep = Annotated[Lifecycle, Depends(get_lifecycle)]
QuotasDep = Annotated[Quotas, Depends(get_quotas)]
CacheDep = Annotated[ResponseCache, Depends(get_cache)]
KeyIdDep = Annotated[str, Depends(get_key_id)]
