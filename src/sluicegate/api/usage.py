"""`GET /admin/usage` (every key, admin keys only) and `GET /v1/me/usage` (the caller's own
key): the usage ledger's rows per key, model and day or month, with their totals
(`tenancy.usage`). JSON, or CSV with `Accept: text/csv`.

A call of `/v1/me/usage` is counted against its key's requests per minute like any request,
and reads at most `MAX_OWN_DAYS` days; `/admin/usage` is counted by the admin guard
(`http.admin_guard`) and reads at most `MAX_DAYS`."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from sluicegate.api.deps import AdminDep, CountedDep, KeyIdDep, StateDep
from sluicegate.errors import NotFoundError
from sluicegate.http.admin_guard import USAGE_LEDGER_OFF
from sluicegate.http.state import AppState
from sluicegate.tenancy.usage import MAX_OWN_DAYS, GroupBy, UsageQuery, UsageReader, as_csv

router = APIRouter(tags=["usage"])


@router.get("/admin/usage", dependencies=[AdminDep], response_model=None)
async def all_usage(
    request: Request,
    state: StateDep,
    key_id: Annotated[str | None, Query(max_length=64)] = None,
    model: Annotated[str | None, Query(max_length=256)] = None,
    start: date | None = None,
    end: date | None = None,
    group_by: GroupBy = "day",
) -> Response:
    query = UsageQuery.of(_today(), start, end, key_id, model, group_by)
    return await _answer(request, await _reader(state).read(query))


@router.get("/v1/me/usage", dependencies=[CountedDep], response_model=None)
async def my_usage(
    request: Request,
    state: StateDep,
    key: KeyIdDep,
    model: Annotated[str | None, Query(max_length=256)] = None,
    start: date | None = None,
    end: date | None = None,
    group_by: GroupBy = "day",
) -> Response:
    query = UsageQuery.of(_today(), start, end, key, model, group_by, MAX_OWN_DAYS)
    return await _answer(request, await _reader(state).read(query))


def _reader(state: AppState) -> UsageReader:
    if state.usage is None:
        raise NotFoundError(USAGE_LEDGER_OFF)
    return state.usage


async def _answer(request: Request, answer: dict[str, Any]) -> Response:
    """The answer rendered in a thread (it may hold many rows)."""
    if "text/csv" in request.headers.get("accept", ""):
        text = await asyncio.to_thread(as_csv, answer)
        return Response(text, media_type="text/csv")
    return Response(await asyncio.to_thread(orjson.dumps, answer), media_type="application/json")


def _today() -> date:
    return datetime.now(UTC).date()
