"""Reading the usage ledger (`tenancy.ledger`): rows per key, model and day or month, with
their totals, as JSON or CSV (`/admin/usage`, `/v1/me/usage`).

A query reads one hash per key and day: for one key, a day is one `HGETALL`; for every key,
the day's set of keys first. Commands go in pipelines of `_PIPELINE`, each with its own
time limit, and the replies are summed and sorted in a thread (as the answer is rendered), so
a year of thousands of keys does not hold the event loop. What a process has not written
yet (at most a flush interval's worth) is not in the answer.
"""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, Literal

import redis.asyncio
from redis.exceptions import RedisError

from sluicegate.deadline import Deadline
from sluicegate.errors import InvalidRequestError, StoreUnavailableError
from sluicegate.prices import units
from sluicegate.tenancy.ledger import MEASURES, day_set, hash_key

GroupBy = Literal["day", "month"]
MAX_DAYS = 366
"""The longest range one query of every key's usage reads (`/admin/usage`)."""
MAX_OWN_DAYS = 93
"""The longest range a key's query of its own usage reads (`/v1/me/usage`): a quarter."""
_PIPELINE = 500
_FAILURES = (TimeoutError, OSError, RedisError)
CSV_COLUMNS = ("period", "key_id", "model", *MEASURES)


@dataclass(frozen=True, slots=True)
class UsageQuery:
    start: date
    end: date
    key_id: str | None = None
    model: str | None = None
    group_by: GroupBy = "day"

    @classmethod
    def of(
        cls,
        today: date,
        start: date | None,
        end: date | None,
        key_id: str | None,
        model: str | None,
        group_by: GroupBy,
        max_days: int = MAX_DAYS,
    ) -> UsageQuery:
        """A query from the API's parameters: by default from the first of this month to
        today (UTC); at most `max_days` days. The ledger holds nothing after today: an end
        after it reads up to today, and a start after it is refused."""
        if start is not None and start > today:
            raise InvalidRequestError(
                f"start must not be after today ({today.isoformat()}, UTC): the ledger holds "
                "no usage after it.",
                param="start",
            )
        end = today if end is None or end > today else end
        start = start or end.replace(day=1)
        if start > end:
            raise InvalidRequestError("start must not be after end.", param="start")
        if (end - start).days >= max_days:
            raise InvalidRequestError(
                f"A usage query here covers at most {max_days} days.", param="start"
            )
        return cls(start, end, key_id, model, group_by)

    def days(self) -> Iterator[str]:
        day = self.start
        while day <= self.end:
            yield day.isoformat()
            day += timedelta(days=1)

    def period(self, day: str) -> str:
        return day if self.group_by == "day" else day[:7]


class UsageReader:
    def __init__(self, client: redis.asyncio.Redis, prefix: str, op_timeout: float = 5.0):
        """`op_timeout`: seconds each pipeline of `_PIPELINE` commands may take."""
        self._client = client
        self._prefix = prefix
        self._op_timeout = op_timeout
        # Waited for, not cancelled: a cancelled call closes its pooled connection.
        self._deadline = Deadline(op_timeout)

    async def read(self, query: UsageQuery) -> dict[str, Any]:
        """`{"object": "list", "data": [rows], "totals": {...}}`; each row has `period`,
        `key_id`, `model` and the measures, cost in currency."""
        try:
            slots = await self._slots(query)
            replies = await self._fetch([hash_key(self._prefix, d, k) for d, k in slots])
        except _FAILURES as exc:
            raise StoreUnavailableError(
                "The usage ledger (Redis) does not answer. Retry later."
            ) from exc
        # Summed and sorted in a thread: a year of thousands of keys is seconds of work.
        return await asyncio.to_thread(_summary, query, slots, replies)

    async def _slots(self, query: UsageQuery) -> list[tuple[str, str]]:
        """(day, key id) of every hash the query reads."""
        days = list(query.days())
        if query.key_id is not None:
            return [(day, query.key_id) for day in days]
        slots: list[tuple[str, str]] = []
        for start in range(0, len(days), _PIPELINE):
            chunk = days[start : start + _PIPELINE]
            pipe = self._client.pipeline(transaction=False)
            for day in chunk:
                pipe.smembers(day_set(self._prefix, day))
            replies = await self._deadline.run(pipe.execute())
            for day, members in zip(chunk, replies, strict=True):
                slots += ((day, _text(m)) for m in sorted(members))
        return slots

    async def _fetch(self, keys: list[str]) -> list[dict[bytes, bytes]]:
        replies: list[dict[bytes, bytes]] = []
        for start in range(0, len(keys), _PIPELINE):
            pipe = self._client.pipeline(transaction=False)
            for key in keys[start : start + _PIPELINE]:
                pipe.hgetall(key)
            replies += await self._deadline.run(pipe.execute())
        return replies


def _summary(
    query: UsageQuery, slots: list[tuple[str, str]], replies: list[dict[bytes, bytes]]
) -> dict[str, Any]:
    rows: dict[tuple[str, str, str], list[int]] = {}
    for (day, key), fields in zip(slots, replies, strict=True):
        period = query.period(day)
        for name, amount in fields.items():
            measure, _, model = _text(name).partition(":")
            if measure not in MEASURES or (query.model is not None and model != query.model):
                continue
            totals = rows.setdefault((period, key, model), [0] * len(MEASURES))
            totals[MEASURES.index(measure)] += int(amount)
    data = [_row(slot, totals) for slot, totals in sorted(rows.items())]
    grand = [sum(t[i] for t in rows.values()) for i in range(len(MEASURES))]
    return {"object": "list", "data": data, "totals": _measures(grand)}


def as_csv(answer: dict[str, Any]) -> str:
    """The rows of an answer as CSV, with a header line (no totals: sum the columns).

    A model name is whatever a request asked for: text a spreadsheet would run as a formula
    (starting with `=`, `+`, `-`, `@`, a tab or a carriage return) is written with a `'`
    before it, and every text cell is quoted, as OWASP's advice on CSV injection has it."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
    writer.writerow(CSV_COLUMNS)
    for row in answer["data"]:
        writer.writerow([_cell(row[column]) for column in CSV_COLUMNS])
    return out.getvalue()


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: object) -> object:
    """`value`, or a text that starts like a formula with `'` before it."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def _row(slot: tuple[str, str, str], totals: list[int]) -> dict[str, Any]:
    period, key, model = slot
    return {"period": period, "key_id": key, "model": model, **_measures(totals)}


def _measures(totals: list[int]) -> dict[str, Any]:
    shown: dict[str, Any] = dict(zip(MEASURES, totals, strict=True))
    shown["cost"] = units(totals[MEASURES.index("cost")])
    return shown


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
