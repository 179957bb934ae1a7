"""The adapters of the in-process engine, over a stand-in for vLLM's `AsyncLLM` that records
its LoRA calls (not vLLM: the real engine loads adapters in the integration tests)."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from sluicegate.engine.lora import BaseModel
from sluicegate.engine.lora_snapshots import Snapshots
from sluicegate.engine.vllm_adapters import LoadedAdapters
from sluicegate.errors import EngineUnavailableError, InvalidRequestError, NotFoundError
from tests.support.fakes import FakeLoraLLM


def folder(tmp_path: Path, name: str = "ad", rank: int = 8) -> str:
    path = tmp_path / name
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": rank}))
    (path / "adapter_model.bin").write_bytes(b"w")
    return str(path)


def gone(path: Path) -> bool:
    return not path.exists()


def adapters(llm: FakeLoraLLM) -> LoadedAdapters:
    return LoadedAdapters(llm, 16, BaseModel.of(set(), {}))


async def test_each_load_gets_an_id_of_its_own(tmp_path: Path) -> None:
    llm = FakeLoraLLM()
    loaded = adapters(llm)
    await loaded.load("a", folder(tmp_path, "a"))
    await loaded.load("b", folder(tmp_path, "b"))
    loaded.unload("a")
    await loaded.load("a", folder(tmp_path, "c"))
    ids = [r.lora_int_id for r in llm.added]
    assert len(set(ids)) == 3 and all(i > 0 for i in ids)
    assert loaded.names() == ["b", "a"]
    await loaded.close()


async def test_what_vllm_refuses_is_a_400_in_its_own_words(tmp_path: Path) -> None:
    llm = FakeLoraLLM(
        "Call to add_lora method failed: Worker failed with error 'While loading x, expected "
        "target modules in [q_proj] but received [mlp]', please check the stack trace above"
    )
    loaded = adapters(llm)
    with pytest.raises(InvalidRequestError) as caught:
        await loaded.load("a", folder(tmp_path))
    assert caught.value.message == (
        "vLLM refused the adapter: While loading x, expected target modules in [q_proj] but "
        "received [mlp]"
    )
    assert caught.value.param == "lora_path"
    await loaded.close()


async def test_a_checked_refusal_never_reaches_vllm(tmp_path: Path) -> None:
    llm = FakeLoraLLM()
    with pytest.raises(InvalidRequestError, match="no adapter folder"):
        await adapters(llm).load("a", str(tmp_path / "nowhere"))
    assert llm.added == []


async def test_unloading_lets_running_requests_finish_before_vllm_drops_it(
    tmp_path: Path,
) -> None:
    llm = FakeLoraLLM()
    loaded = adapters(llm)
    await loaded.load("a", folder(tmp_path))
    with loaded.using("a") as request:
        loaded.unload("a")
        # Gone for new requests at once...
        with pytest.raises(NotFoundError), loaded.using("a"):
            pass
        await asyncio.sleep(0.05)
        # ... and still in the engine while this one runs.
        assert llm.removed == []
    deadline = time.monotonic() + 10
    while not llm.removed:  # once the request is done
        assert time.monotonic() < deadline, "the adapter was not removed in 10 s"
        await asyncio.sleep(0.01)
    assert llm.removed == [request.lora_int_id]
    with pytest.raises(NotFoundError):
        loaded.unload("a")
    await loaded.close()


async def test_two_loads_of_one_name_at_once_load_it_once(tmp_path: Path) -> None:
    llm = FakeLoraLLM()
    loaded = adapters(llm)
    path = folder(tmp_path)
    results = await asyncio.gather(
        loaded.load("a", path), loaded.load("a", path), return_exceptions=True
    )
    assert sum(isinstance(r, InvalidRequestError) for r in results) == 1
    assert len(llm.added) == 1
    await loaded.close()


async def test_vllm_reads_a_snapshot_that_outlives_the_folder_it_came_from(
    tmp_path: Path,
) -> None:
    """vLLM reads an adapter it has evicted again from `lora_path`, inside a model step: the
    path it is given must still hold what was checked, whatever became of the folder."""
    llm = FakeLoraLLM()
    loaded = adapters(llm)
    path = folder(tmp_path)
    await loaded.load("a", path)
    given = Path(llm.added[0].lora_path)
    assert not given.is_relative_to(path)
    shutil.rmtree(path)
    assert json.loads((given / "adapter_config.json").read_text()) == {"r": 8}
    assert (given / "adapter_model.bin").read_bytes() == b"w"
    assert loaded.identity("a").startswith(f"{path}@")  # named by its folder, not the copy
    await loaded.close()
    assert gone(given)


async def test_a_snapshot_goes_once_vllm_has_dropped_its_adapter(tmp_path: Path) -> None:
    llm = FakeLoraLLM()
    loaded = adapters(llm)
    await loaded.load("a", folder(tmp_path))
    given = Path(llm.added[0].lora_path)
    loaded.unload("a")
    deadline = time.monotonic() + 10
    while not gone(given):
        assert time.monotonic() < deadline, "the snapshot outlived its adapter by 10 s"
        await asyncio.sleep(0.01)
    assert llm.removed == [llm.added[0].lora_int_id] and gone(given)
    await loaded.close()


async def test_a_refused_adapter_leaves_no_snapshot(tmp_path: Path) -> None:
    owned = tmp_path / "owned"
    owned.mkdir()
    llm = FakeLoraLLM("Call to add_lora method failed: no")
    loaded = LoadedAdapters(llm, 16, BaseModel.of(set(), {}), Snapshots(str(owned)))
    with pytest.raises(InvalidRequestError, match="vLLM refused"):
        await loaded.load("a", folder(tmp_path))
    with pytest.raises(InvalidRequestError, match="rank 64"):
        await loaded.load("b", folder(tmp_path, "big", rank=64))
    assert [list(made.iterdir()) for made in owned.iterdir()] == [[]]
    await loaded.close()
    assert list(owned.iterdir()) == []


async def test_loads_at_run_time_are_confined_to_the_roots(tmp_path: Path) -> None:
    llm = FakeLoraLLM()
    loaded = adapters(llm)
    (tmp_path / "roots").mkdir()
    inside = folder(tmp_path / "roots")
    outside = folder(tmp_path, "outside")
    roots = [str(tmp_path / "roots")]
    with pytest.raises(InvalidRequestError, match="outside the folders") as caught:
        await loaded.load("a", outside, roots)
    assert caught.value.param == "lora_path"
    await loaded.load("a", inside, roots)
    await loaded.load("b", outside)  # the operator's own (LORA_MODULES): anywhere
    assert [r.lora_name for r in llm.added] == ["a", "b"]
    await loaded.close()


async def settled(check: Callable[[], bool]) -> bool:
    for _ in range(500):
        if check():
            return True
        await asyncio.sleep(0.01)
    return check()


class HeldSnapshots(Snapshots):
    """Snapshots whose `take` waits (in its thread) until `release` is set."""

    def __init__(self, parent: str) -> None:
        super().__init__(parent)
        self.taking = threading.Event()
        self.release = threading.Event()

    def take(self, source: str, key: str, roots: Sequence[str] | None) -> str:
        self.taking.set()
        self.release.wait(30)
        return super().take(source, key, roots)


class HeldLoraLLM(FakeLoraLLM):
    """Takes the adapter, then never answers."""

    async def add_lora(self, request: Any) -> bool:
        self.added.append(request)
        await asyncio.Event().wait()
        return True


def snapshots_in(owned: Path) -> list[Path]:
    return [snapshot for made in owned.iterdir() for snapshot in made.iterdir()]


async def test_a_load_cancelled_while_its_snapshot_is_made_leaves_none(tmp_path: Path) -> None:
    owned = tmp_path / "owned"
    owned.mkdir()
    snapshots = HeldSnapshots(str(owned))
    llm = FakeLoraLLM()
    loaded = LoadedAdapters(llm, 16, BaseModel.of(set(), {}), snapshots)
    load = asyncio.create_task(loaded.load("a", folder(tmp_path)))
    assert await asyncio.to_thread(snapshots.taking.wait, 30)
    load.cancel()
    with pytest.raises(asyncio.CancelledError):
        await load
    snapshots.release.set()  # the thread ends after the cancellation, its copy made
    assert await settled(lambda: not snapshots_in(owned) and not loaded._retiring)
    assert loaded.names() == [] and llm.added == []
    await loaded.close()


async def test_a_load_cancelled_while_vllm_takes_it_removes_it_and_its_snapshot(
    tmp_path: Path,
) -> None:
    owned = tmp_path / "owned"
    owned.mkdir()
    llm = HeldLoraLLM()
    loaded = LoadedAdapters(llm, 16, BaseModel.of(set(), {}), Snapshots(str(owned)))
    load = asyncio.create_task(loaded.load("a", folder(tmp_path)))
    assert await settled(lambda: bool(llm.added))
    load.cancel()
    with pytest.raises(asyncio.CancelledError):
        await load
    assert await settled(lambda: not snapshots_in(owned))
    assert llm.removed == [llm.added[0].lora_int_id] and loaded.names() == []
    await loaded.close()


class VanishingSnapshots(Snapshots):
    def take(self, source: str, key: str, roots: Sequence[str] | None) -> str:
        raise FileNotFoundError(2, "No such file or directory", source)  # a link gone meanwhile


async def test_an_adapter_file_failing_to_be_read_is_a_400_on_its_path(tmp_path: Path) -> None:
    llm = FakeLoraLLM()
    loaded = LoadedAdapters(llm, 16, BaseModel.of(set(), {}), VanishingSnapshots())
    with pytest.raises(InvalidRequestError, match="cannot be read") as caught:
        await loaded.load("a", folder(tmp_path))
    assert caught.value.param == "lora_path" and llm.added == []
    await loaded.close()


async def test_a_temporary_folder_that_cannot_take_the_copy_is_a_503_naming_no_path(
    tmp_path: Path,
) -> None:
    parent = tmp_path / "no-such-tmpdir"
    loaded = LoadedAdapters(FakeLoraLLM(), 16, BaseModel.of(set(), {}), Snapshots(str(parent)))
    with pytest.raises(EngineUnavailableError, match="temporary folder") as caught:
        await loaded.load("a", folder(tmp_path))
    assert caught.value.status_code == 503 and str(parent) not in caught.value.message
    parent.mkdir()
    await loaded.load("a", folder(tmp_path, "b"))
    for made in parent.iterdir():  # its folder removed under it (a cleaner of TMPDIR)
        shutil.rmtree(made)
    with pytest.raises(EngineUnavailableError, match="temporary folder") as caught:
        await loaded.load("c", folder(tmp_path, "c"))
    assert str(parent) not in caught.value.message
    await loaded.close()
