"""Fakes of a tune's trial gateways: the fake engine's app served in this process behind the
handle `sluicegate tune` drives (`tuning.trials.Gateway`); freezing and stopping are recorded,
not done. The admission bounds go through the app's real `PUT /admin/admission`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import httpx

from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread

KEY = "sk-trials-admin"
"""The fake gateways' key (an admin's)."""
BOUNDS: dict[str, object] = {
    "ttft_objective": None,
    "max_engine_running": None,
    "max_engine_waiting": None,
    "max_kv_cache_usage": None,
}


@dataclass
class FakeGateway:
    """Stands in for a `sluicegate serve` process: a fake-engine app served in this process;
    freezing and stopping are recorded, not done."""

    url: str
    engine: FakeEngine
    name: str
    model: str = FAKE_MODEL
    started_in: float = 1.0
    events: list[str] = field(default_factory=list)
    bounds: list[dict[str, object]] = field(default_factory=list)
    frozen: bool = False
    seen: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    """Shared by the gateways of a test: at each run, which ran and which were frozen."""
    peers: list[FakeGateway] = field(default_factory=list)
    history: list[tuple[str, int]] = field(default_factory=list)
    """Each reset (`forget`) and bounds set (`bounds`), with the requests its engine had had
    by then: their order around a run's requests."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEY}"}

    async def start(self) -> None:
        self.events.append("start")

    async def set_admission(self, bounds: Mapping[str, object]) -> None:
        async with httpx.AsyncClient(headers=self.headers) as client:
            response = await client.put(self.url + "/admin/admission", json=dict(bounds))
        assert response.status_code == 200, response.text
        self.bounds.append(dict(bounds))
        self.history.append(("bounds", len(self.engine.prompts)))
        self.seen.append((self.name, tuple(p.name for p in self.peers if p.frozen)))

    async def forget(self) -> None:
        async with httpx.AsyncClient(headers=self.headers) as client:
            response = await client.post(self.url + "/admin/admission/reset")
        assert response.status_code == 200, response.text
        self.events.append("forget")
        self.history.append(("forget", len(self.engine.prompts)))

    @property
    def exited(self) -> bool:
        return False

    async def settle(self) -> bool:
        """Nothing to wait for: a replay's requests end with it in the fake engine."""
        return True

    def freeze(self) -> None:
        if not self.frozen:
            self.events.append("freeze")
        self.frozen = True

    async def thaw(self) -> None:
        if self.frozen:
            self.events.append("thaw")
        self.frozen = False

    async def stop(self) -> None:
        self.events.append("stop")


@contextlib.contextmanager
def gateways(*engines: FakeEngine) -> Iterator[list[FakeGateway]]:
    with contextlib.ExitStack() as stack:
        made: list[FakeGateway] = []
        seen: list[tuple[str, tuple[str, ...]]] = []
        for index, engine in enumerate(engines):
            app = fake_app(engine, api_keys=KEY, admin_api_keys=KEY, allow_runtime_admission=True)
            url = stack.enter_context(serve_in_thread(app))
            made.append(FakeGateway(url, engine, f"g{index}", seen=seen, peers=made))
        yield made
