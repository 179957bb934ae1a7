"""The adapters' snapshots (`engine.lora_snapshots`): what is copied, from where, and what is
refused, on real folders."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from sluicegate.engine import lora_snapshots
from sluicegate.engine.lora import AdapterError, within_roots
from sluicegate.engine.lora_snapshots import Snapshots


def adapter(folder: Path, weights: bytes = b"weights") -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


@pytest.fixture
def snapshots(tmp_path: Path) -> Snapshots:
    made = Snapshots(parent=str(tmp_path / "owned"))
    (tmp_path / "owned").mkdir()
    return made


def test_a_snapshot_holds_what_vllm_reads_with_its_times_and_outlives_its_source(
    tmp_path: Path, snapshots: Snapshots
) -> None:
    source = adapter(tmp_path / "roots" / "ad1")
    (source / "adapter_model.bin").write_bytes(b"not read: the safetensors come first")
    (source / "README.md").write_text("not read by vLLM")
    os.utime(source / "adapter_model.safetensors", ns=(1_000_000_000, 2_000_000_000))
    taken = Path(snapshots.take(str(source), "1", roots=[str(tmp_path / "roots")]))
    assert not taken.is_relative_to(source)
    assert sorted(p.name for p in taken.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert (taken / "adapter_model.safetensors").stat().st_mtime_ns == 2_000_000_000
    for path in source.iterdir():
        path.unlink()
    source.rmdir()
    assert (taken / "adapter_model.safetensors").read_bytes() == b"weights"
    snapshots.drop(str(taken))
    assert not taken.exists()
    snapshots.close()
    assert list((tmp_path / "owned").iterdir()) == []


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda t: t / "elsewhere" / "ad1", "outside the folders adapters may be loaded from"),
        (lambda t: t / "roots" / "link", "outside the folders adapters may be loaded from"),
        (lambda t: t / "roots" / "leaky", "leaky/adapter_model.safetensors is outside"),
        (lambda t: t / "roots" / "nowhere", "no adapter folder at"),
        (lambda t: t / "roots" / "empty", "holds no adapter_config.json"),
        (lambda t: t / "roots" / "fifo", "adapter_config.json is not a regular file"),
        (lambda t: t / "roots" / ".." / "elsewhere" / "ad1", "outside the folders"),
    ],
)
def test_what_is_outside_the_roots_or_no_adapter_is_refused_saying_so(
    tmp_path: Path, snapshots: Snapshots, make: object, says: str
) -> None:
    roots = tmp_path / "roots"
    outside = adapter(tmp_path / "elsewhere" / "ad1")
    roots.mkdir()
    (roots / "link").symlink_to(outside)  # a symlink inside, to a folder outside
    leaky = adapter(roots / "leaky")
    (leaky / "adapter_model.safetensors").unlink()
    (leaky / "adapter_model.safetensors").symlink_to(outside / "adapter_model.safetensors")
    (roots / "empty").mkdir()
    fifo = adapter(roots / "fifo")
    (fifo / "adapter_config.json").unlink()
    os.mkfifo(fifo / "adapter_config.json")  # opened as a file, it would block for ever
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(AdapterError) as caught:
        snapshots.take(str(path), "1", roots=[str(roots)])
    assert says in str(caught.value)
    assert str(outside) not in str(caught.value).replace(str(path), "")  # not where it leads
    snapshots.close()


def test_without_roots_any_absolute_folder_is_taken(tmp_path: Path, snapshots: Snapshots) -> None:
    source = adapter(tmp_path / "anywhere")
    assert Path(snapshots.take(str(source), "1", roots=None)).is_dir()
    with pytest.raises(AdapterError, match="not an absolute path"):
        snapshots.take("relative/ad", "2", roots=None)
    snapshots.close()


def test_a_root_reached_through_a_symlink_is_the_same_root(
    tmp_path: Path, snapshots: Snapshots
) -> None:
    adapter(tmp_path / "real" / "ad1")
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    taken = snapshots.take(str(tmp_path / "alias" / "ad1"), "1", roots=[str(tmp_path / "alias")])
    assert Path(taken).is_dir()
    snapshots.close()


def test_a_weights_link_leading_out_is_refused_whether_or_not_its_target_exists(
    tmp_path: Path, snapshots: Snapshots
) -> None:
    """Nothing tells whether a file outside the roots exists."""
    roots = tmp_path / "roots"
    outside = adapter(tmp_path / "outside")
    answers = []
    for name, target in (("there", "adapter_model.safetensors"), ("not-there", "missing")):
        folder = adapter(roots / name)
        (folder / "adapter_model.bin").write_bytes(b"weights")
        (folder / "adapter_model.safetensors").unlink()
        (folder / "adapter_model.safetensors").symlink_to(outside / target)
        with pytest.raises(AdapterError) as caught:
            snapshots.take(str(folder), name, roots=[str(roots)])
        answers.append(str(caught.value).replace(name, "NAME"))
    assert answers[0] == answers[1] and "outside the folders" in answers[0]
    snapshots.close()


@pytest.mark.parametrize("checked", ["the folder", "its config"])
def test_a_folder_swapped_for_a_link_out_after_the_check_copies_nothing_from_outside(
    tmp_path: Path, snapshots: Snapshots, monkeypatch: pytest.MonkeyPatch, checked: str
) -> None:
    """A folder on the way to the adapter replaced by a symlink out of the roots between the
    check of a path and its opening: what is copied is never what lies outside."""
    roots = tmp_path / "roots"
    adapter(roots / "a" / "x")
    outside = adapter(tmp_path / "outside" / "x", weights=b"SECRET")
    (outside / "adapter_config.json").write_text('{"SECRET": true}')

    def swap(out: bool) -> None:
        if out:
            (roots / "a").rename(roots / "moved")
            (roots / "a").symlink_to(tmp_path / "outside")
        else:
            (roots / "a").unlink()
            (roots / "moved").rename(roots / "a")

    def check_then_swap(path: str | Path, allowed: Sequence[str], shown: str) -> Path:
        name = Path(path).name
        if name == "adapter_model.safetensors" and checked == "its config":
            swap(out=False)  # back before the weights are checked: only the config went out
        real = within_roots(path, allowed, shown)
        if name == ("x" if checked == "the folder" else "adapter_config.json"):
            swap(out=True)
        return real

    monkeypatch.setattr(lora_snapshots, "within_roots", check_then_swap)
    try:
        taken = Path(snapshots.take(str(roots / "a" / "x"), "1", roots=[str(roots)]))
    except AdapterError as refused:
        assert "SECRET" not in str(refused)
    else:
        assert "SECRET" not in (taken / "adapter_config.json").read_text()
        assert (taken / "adapter_model.safetensors").read_bytes() == b"weights"
    snapshots.close()
