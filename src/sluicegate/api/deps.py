"""Typed access to what the lifespan opened (FastAPI `Annotated` dependencies)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sluicegate.engine.protocol import EngineClient
from sluicegate.lifecycle import Lifecycle
from sluicegate.quota import ANONYMOUS, Quotas
from sluicegate.service import CompletionService
from sluicegate.settings import Settings


def get_service(request: Request) -> CompletionService:
    service: CompletionService = request.state.service
    return service


def get_engine(request: Request) -> EngineClient:
    engine: EngineClient = request.state.engine
    return engine


def get_settings(request: Request) -> Settings:
    settings: Settings = request.state.settings
    return settings


def get_started_at(request: Request) -> int:
    started_at: int = request.state.started_at
    return started_at


def get_lifecycle(request: Request) -> Lifecycle:
    lifecycle: Lifecycle = request.state.lifecycle
    return lifecycle


def get_quotas(request: Request) -> Quotas:
    quotas: Quotas = request.state.quotas
    return quotas


def get_key_id(request: Request) -> str:
    """The caller's public key id, or `anonymous` when the gateway has no API keys."""
    key_id: str = getattr(request.state, "api_key_id", ANONYMOUS)
    return key_id


ServiceDep = Annotated[CompletionService, Depends(get_service)]
EngineDep = Annotated[EngineClient, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
StartedAtDep = Annotated[int, Depends(get_started_at)]
LifecycleDep = Annotated[Lifecycle, Depends(get_lifecycle)]
QuotasDep = Annotated[Quotas, Depends(get_quotas)]
KeyIdDep = Annotated[str, Depends(get_key_id)]
