"""Snapshot format, config validation, the synchronous checkpointer and its DCP files, corruption and
full-disk handling."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from nvrx_eks.bench.checkpoint.benchstate import every_tier
from nvrx_eks.training.checkpoint import CheckpointConfig, build_checkpointer
from nvrx_eks.training.checkpoint.dcp_format import Stager
from nvrx_eks.training.checkpoint.factory import probe_checkpointer
from nvrx_eks.training.checkpoint.probe import failed
from nvrx_eks.training.checkpoint.shard import ShardError, decode, to_bytes
from nvrx_eks.training.checkpoint.storage import FileStore

CPU = torch.device("cpu")


def state_at(step: int) -> dict:
    return {
        "model": {"w": torch.full((64, 32), float(step)), "i": torch.arange(10, dtype=torch.int16) + step},
        # String keys: DCP's keys are paths of names (an optimizer's state arrives by parameter name).
        "optim": {"state": {"w": {"m": torch.ones(3, dtype=torch.bfloat16) * step}}, "lr": 0.1},
        "rng": torch.tensor([step], dtype=torch.uint8),
        "data": {"step": step, "order": [1, 2, (3, "x")]},
    }


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, dict):
            assert_same(got[key], value)
        elif isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype
            assert torch.equal(got[key], value)
        else:
            assert got[key] == value


def test_snapshot_round_trip_keeps_dtypes_shapes_and_structure():
    state = state_at(7)
    state["strided"] = torch.arange(20.0).reshape(4, 5).t()
    state["empty"] = torch.empty(0, 3)
    got = decode(bytearray(to_bytes(state)))
    assert_same(got, state)


def test_snapshot_decode_rejects_truncation_and_foreign_files():
    blob = to_bytes(state_at(1))
    with pytest.raises(ShardError, match="truncated"):
        decode(bytearray(blob[: len(blob) // 2]))
    with pytest.raises(ShardError, match="magic"):
        decode(bytearray(b"PK\x03\x04" + blob[4:]))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"implementation": "fast"}, "implementation"),
        ({"memory_every": 10, "local_dir": "/x", "local_every": 15}, "multiple of memory_every"),
        ({"peer_replicas": 1, "implementation": "sync"}, "peer_replicas"),
        ({"keep": 0}, "keep"),
        ({"durable_dir": "s3:///nobucket"}, "bucket"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(fields, message):
    with pytest.raises(ValidationError, match=message):
        CheckpointConfig(**fields)


def sync_config(tmp_path, **extra) -> CheckpointConfig:
    fields = {
        "implementation": "sync",
        "local_dir": tmp_path / "local",
        "local_every": 2,
        "durable_dir": str(tmp_path / "durable"),
        "durable_every": 4,
        "keep": 2,
        "fsync": False,
    }
    return CheckpointConfig(**(fields | extra))


def test_sync_resumes_exactly_from_the_newest_step_and_keeps_k(tmp_path):
    ckpt = build_checkpointer(sync_config(tmp_path), rank=0, world_size=1, device=CPU)
    assert ckpt.load_latest() is None
    for step in range(1, 10):
        ckpt.save(step, state_at(step))
    restored = ckpt.load_latest()
    assert (restored.step, restored.tier) == (8, "local")
    assert_same(restored.state, state_at(8))
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["step-000000006", "step-000000008"]
    assert sorted(p.name for p in (tmp_path / "durable").iterdir()) == ["step-000000004", "step-000000008"]


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "no_manifest"])
def test_torn_or_corrupt_shard_is_skipped_reported_and_older_step_used(tmp_path, damage):
    events = []
    ckpt = build_checkpointer(
        sync_config(tmp_path, durable_dir=None, keep=3),
        rank=0,
        world_size=1,
        device=CPU,
        on_event=lambda kind, fields: events.append((kind, fields)),
    )
    for step in (2, 4):
        ckpt.save(step, state_at(step))
    shard = tmp_path / "local" / "step-000000004" / "__0_0.distcp"
    blob = bytearray(shard.read_bytes())
    if damage == "truncate":
        shard.write_bytes(blob[: len(blob) - 100])
    elif damage == "bitflip":
        blob[len(blob) - 5] ^= 0x10
        shard.write_bytes(blob)
    else:
        (shard.parent / "rank-00000.json").unlink()
    restored = ckpt.load_latest()
    assert restored.step == 2
    assert_same(restored.state, state_at(2))
    rejected = [fields for kind, fields in events if kind == "checkpoint_rejected"]
    if damage == "no_manifest":
        assert rejected == []  # never committed: simply not a candidate
    else:
        assert rejected[0]["step"] == 4
        assert ("truncated" if damage == "truncate" else "CRC32") in rejected[0]["reason"]


def test_unwritable_durable_is_reported_training_continues_and_later_retries(tmp_path):
    blocker = tmp_path / "durable"
    blocker.write_text("a file where the durable folder should be")  # mkdir fails: like a broken mount
    events = []
    ckpt = build_checkpointer(
        sync_config(tmp_path, durable_every=2),
        rank=0,
        world_size=1,
        device=CPU,
        on_event=lambda kind, fields: events.append(kind),
    )
    ckpt.save(2, state_at(2))
    assert ckpt.stats.failed["durable"] == 1
    assert "checkpoint_failed" in events
    assert ckpt.stats.persisted["local"] == 1
    blocker.unlink()
    ckpt.save(4, state_at(4))
    assert ckpt.stats.persisted["durable"] == 1
    assert FileStore(tier="durable", root=blocker).manifests(0).keys() == {4}


def test_the_probe_proves_each_tier_and_leaves_nothing_a_restore_reads(tmp_path):
    config = every_tier(tmp_path / "memory", tmp_path, memory_every=2, local_every=2, durable_every=4)
    probes = probe_checkpointer(config)
    # Only the node's own disk is node-local: a failure there is the node's, anywhere else every pod's.
    assert [(p.tier, p.ok, p.node_local) for p in probes] == [
        ("memory", True, False),
        ("local", True, True),
        ("durable", True, False),
    ]
    for folder in ("memory", "local", "durable"):
        assert not list((tmp_path / folder).iterdir()), folder
    ckpt = build_checkpointer(config, rank=0, world_size=1, device=CPU)
    try:
        assert ckpt.load_latest() is None
    finally:
        ckpt.close()


def test_a_tier_the_trainer_may_not_write_names_its_uid_and_the_fix():
    location = "/fsx/durable/job"
    probe = failed("durable", location, PermissionError(errno.EACCES, "Permission denied", location))
    uid = os.getuid()
    assert not probe.ok
    assert probe.detail == (
        f"Permission denied for uid {uid}; make it writable by uid {uid}, the trainer's user, or point "
        "checkpoint.durable_dir at another folder"
    )
    parent = failed("local", "/nvme/a/b", NotADirectoryError(errno.ENOTDIR, "Not a directory", "/nvme/a"))
    assert parent.detail.startswith("Not a directory (/nvme/a); remove the file that stands in its path")


def test_manifest_records_size_and_checksum(tmp_path):
    ckpt = build_checkpointer(sync_config(tmp_path, durable_dir=None), rank=3, world_size=4, device=CPU)
    ckpt.save(2, state_at(2))
    folder = tmp_path / "local" / "step-000000002"
    manifest = json.loads((folder / "rank-00003.json").read_text())
    # The rank's DCP files: its data and its own metadata, each with its size and CRC32.
    assert sorted(manifest["files"]) == ["__3.metadata", "__3_0.distcp"]
    for name, (size, _) in manifest["files"].items():
        assert size == (folder / name).stat().st_size
    assert manifest["world_size"] == 4
    assert len(manifest["layout"]) == 64
    assert not list(folder.glob(".*tmp*"))


def _removed_by_another_rank_once_checked(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """The other rank of the node empties and removes `folder` right after pathlib has checked it is
    a folder and before it lists it (the window `Path.glob` leaves on Python 3.11)."""
    real_is_dir = Path.is_dir

    def is_dir_then_removed(path: Path) -> bool:
        answer = real_is_dir(path)
        if path == folder and answer:
            monkeypatch.setattr(Path, "is_dir", real_is_dir)
            for child in folder.iterdir():
                child.unlink()
            folder.rmdir()
        return answer

    monkeypatch.setattr(Path, "is_dir", is_dir_then_removed)


def test_a_step_folder_removed_by_a_node_mate_mid_prune_fails_nothing(tmp_path, monkeypatch):
    # Ranks 2 and 3 share the node's local tier. Rank 2 prunes step 0 while rank 3, done with its
    # own shard of step 0, removes the emptied folder: rank 2's persist must not fail for that.
    store = FileStore(tier="local", root=tmp_path)
    parts = {rank: Stager(rank=rank, world_size=4).stage({"w": torch.ones(2)}) for rank in (2, 3)}
    for step in (0, 10):
        for rank in (2, 3):
            store.commit(step=step, rank=rank, world_size=4, staged=parts[rank])
    folder = tmp_path / "step-000000000"
    store.delete(0, 3)
    _removed_by_another_rank_once_checked(monkeypatch, folder)

    assert store.manifests().keys() == {10}
    assert store.remove_temporaries(2) == []
    store.commit(step=0, rank=2, world_size=4, staged=parts[2])
    _removed_by_another_rank_once_checked(monkeypatch, folder)
    assert store.prune(rank=2, keep=1) == [0]
    assert not folder.exists()
    assert store.manifests().keys() == {10}


def test_a_durable_step_that_does_not_fit_the_live_state_is_a_layout_mismatch_not_a_fresh_start(tmp_path):
    """The live model changed (another size): its layout matches no copy, the durable step is tried
    resharded, and DCP's planning finds the sizes differ. That is the run's configuration, not a torn
    file: no older step would fit either, so the restore says so instead of starting afresh."""
    from nvrx_eks.training.checkpoint.dcp_format import LayoutMismatchError  # noqa: PLC0415

    ckpt = build_checkpointer(sync_config(tmp_path, local_dir=None), rank=0, world_size=1, device=CPU)
    ckpt.save(4, {"model": {"w": torch.ones(4)}})
    ckpt.close()  # the global metadata of the newest complete step
    seen: list[dict] = []
    with pytest.raises(LayoutMismatchError, match=r"model\.w"):
        ckpt.load_latest(lambda: {"model": {"w": torch.zeros(8)}, "kit": {"next_step": 0}}, seen.append)
    assert seen == [{}]  # shown before any tensor: the step holds no kit section
