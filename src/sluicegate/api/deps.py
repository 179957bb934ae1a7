"""Typed access to what the lifespan opened (FastAPI `Annotated` dependencies)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sluicegate.engine.protocol import EngineClient
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


ServiceDep = Annotated[CompletionService, Depends(get_service)]
EngineDep = Annotated[EngineClient, Depends(get_engine)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
StartedAtDep = Annotated[int, Depends(get_started_at)]
