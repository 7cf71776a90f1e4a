"""The disk tiers keep up by construction, and a tier that falls behind is never silent.

- The staging slots follow from the tiers that read them; `job render` refuses fewer (exit 2).
- Real gloo ranks with the default slots and the peer replica: every disk tier stays within one
  cadence (plus one write) of the newest step. With 2 slots it wrote step 0 only.
- A persist cut by a kill -9 is redone from the restored state at the next step; the killed writer's
  temporary file is gone after the restart.
- After a restore the state is replicated at once: a second node loss before the next due snapshot
  still restores from RAM.
- Retention is job-wide: the newest step committed on every rank is never deleted.
- A tier behind its cadence: a `checkpoint_behind` event, the age metric, a warning in the report.
- One write is measured, not guessed, across a restart too: a kill -9 just before a due step leaves
  no tier reported behind, and a restarted process's first write slower than its predecessor's is.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
import yaml

from nvrx_eks.bench.checkpoint.benchstate import every_tier
from nvrx_eks.training.checkpoint.agreement import Agreement, Flags
from nvrx_eks.training.checkpoint.base import Placement
from nvrx_eks.training.checkpoint.config import CheckpointConfig
from nvrx_eks.training.checkpoint.dcp_format import Stager
from nvrx_eks.training.checkpoint.storage import FileStore
from nvrx_eks.training.checkpoint.tiered import TieredCheckpointer

if TYPE_CHECKING:
    from collections.abc import Callable

REPO = Path(__file__).resolve().parents[2]
VALUES = REPO / "k8s" / "values"
CPU = torch.device("cpu")


# --- slot sizing ------------------------------------------------------------------------------------
def test_slots_follow_from_the_tiers_and_fewer_are_refused(tmp_path):
    base = {"memory_dir": tmp_path / "shm", "memory_every": 2}
    disks = {"local_dir": tmp_path / "l", "local_every": 4, "durable_dir": str(tmp_path / "d")}
    assert CheckpointConfig(**base).staging_slots == 1
    assert CheckpointConfig(**base, **disks, durable_every=4).staging_slots == 3
    assert CheckpointConfig(**base, **disks, durable_every=4, peer_replicas=1).staging_slots == 6
    assert CheckpointConfig(**base, peer_replicas=1).staging_slots == 4
    with pytest.raises(ValueError, match=r"num_staging_slots=4 is below the 6 staging slots"):
        CheckpointConfig(**base, **disks, durable_every=4, peer_replicas=1, num_staging_slots=4)
    assert CheckpointConfig(**base, **disks, durable_every=4, num_staging_slots=6).staging_slots == 6


def test_render_refuses_too_few_staging_slots_with_the_fix(tmp_path, nvrx_eks):
    """The p5 values' tiers (local, durable, the peer replica) need 6 slots; 2 rendered silently and
    the disk tiers then wrote step 0 only."""
    proc = nvrx_eks(
        *("job", "render", "-f", str(VALUES / "p5-2.yaml"), "-o", str(tmp_path)),
        *("--set", "trainer.checkpoint.num_staging_slots=2"),
        timeout=180,
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "num_staging_slots=2 is below the 6 staging slots" in proc.stderr
    assert "leave num_staging_slots unset" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_example_runs_the_same_derived_slots():
    """The p5 and local examples set no slot count: each gets the slots its tiers need."""
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415
    from nvrx_eks.training.resilience.config import config_document  # noqa: PLC0415

    for path in sorted(VALUES.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        assert "num_staging_slots" not in (raw.get("trainer", {}).get("checkpoint") or {}), path
        values = load_values(path)
        # What the ranks are handed (NVRX_EKS_CONFIG) sets no slot count either: they derive it.
        assert "num_staging_slots" not in config_document(values.trainer)["checkpoint"], path
        config = values.trainer.checkpoint
        tiers = [tier for tier, _ in config.tiers()] + (["peer"] if config.peer_replicas else [])
        assert tiers == ["memory", "local", "durable", "peer"], path
        assert config.staging_slots == config.slots_needed() == 6, path


# --- job-wide retention -----------------------------------------------------------------------------
def _commit(store: FileStore, step: int, rank: int) -> None:
    staged = Stager(rank=rank, world_size=2).stage({"x": torch.zeros(4)})
    store.commit(step=step, rank=rank, world_size=2, staged=staged)


def test_retention_never_deletes_the_newest_step_every_rank_committed(tmp_path):
    """Rank 0 committed 10, 20, 30; rank 1 committed 10 and is still writing 20 (30 failed on it).
    Pruning rank 0 by its own steps (keep 1) deleted 10 and 20: no step in common was left."""
    store = FileStore(tier="durable", root=tmp_path, fsync=False)
    for step in (10, 20, 30):
        _commit(store, step, 0)
    _commit(store, 10, 1)
    assert store.prune(rank=0, keep=1, complete=10) == []
    assert sorted(store.manifests(0)) == [10, 20, 30]
    _commit(store, 20, 1)
    assert store.prune(rank=0, keep=1, complete=20) == [10]  # an older step goes, the newest complete stays
    assert store.prune(rank=1, keep=1, complete=20) == [10]
    assert sorted(store.manifests()) == [20, 30]
    assert store.prune(rank=0, keep=1, complete=-1) == []  # nothing known complete: nothing deleted


def test_agreed_flags_name_the_newest_step_every_rank_committed():
    agreement = Agreement(tiers=["local"], device=CPU, disk_tiers=("local",))
    ranks = [
        Flags(unheld=3, busy={"local": False}, committed={"local": 30}, failed={"local": -1}),
        Flags(unheld=2, busy={"local": True}, committed={"local": 20}, failed={"local": 10}),
    ]
    encoded = torch.stack([agreement._encode(flags) for flags in ranks]).max(dim=0).values
    agreed = agreement._decode(encoded)
    assert agreed.unheld == 2
    assert agreed.complete("local") == 20
    ranks[1] = Flags(unheld=2, busy={"local": True}, committed={"local": 20}, failed={"local": 20})
    encoded = torch.stack([agreement._encode(flags) for flags in ranks]).max(dim=0).values
    assert agreement._decode(encoded).complete("local") is None  # step 20 failed on a rank


# --- a tier behind: the event, the metric, the report -------------------------------------------------
def test_a_tier_whose_writes_outlast_the_cadence_is_reported_behind(tmp_path):
    """One rank, a durable persist that takes far longer than its cadence: the tier falls behind and
    says so (event), the rank's metric shows its age, the run report warns."""
    from nvrx_eks.localrun.summary import checkpoint_warnings  # noqa: PLC0415
    from nvrx_eks.training.metrics import Metrics  # noqa: PLC0415

    config = CheckpointConfig(
        memory_dir=tmp_path / "shm",
        memory_every=1,
        durable_dir=str(tmp_path / "durable"),
        durable_every=2,
        fsync=False,
    )
    events: list[dict[str, Any]] = []
    metrics = Metrics(run_dir=tmp_path, rank=0, every=1000, port=None, local_rank=0)

    def emit(kind: str, fields: dict[str, Any]) -> None:
        event = {"kind": kind, "t": time.time(), **fields}
        events.append(event)
        metrics.observe(event)

    ckpt = TieredCheckpointer(
        config=config,
        placement=Placement(rank=0, world_size=1, node_index=0, device=CPU, emit=emit),
        persist_delay_s=1.5,
    )
    try:
        weights = torch.zeros(16)
        for step in range(12):
            ckpt.fence()
            weights += 1
            ckpt.save(step, {"w": weights})
            metrics.step(step=step, step_s=0.05, ckpt_s=0.0, loss=0.0)
            time.sleep(0.05)
    finally:
        ckpt.close()
    behind = [e for e in events if e["kind"] == "checkpoint_behind"]
    assert behind, [e["kind"] for e in events]
    assert behind[0]["tier"] == "durable"
    assert behind[0]["age_steps"] > behind[0]["allowed_steps"] >= 3
    assert ckpt.stats.behind["durable"] == 1
    metrics.write()
    text = metrics.path.read_text()
    assert 'trainer_checkpoint_age_steps{rank="0",tier="memory"} 0.0' in text
    assert 'trainer_checkpoint_behind_total{rank="0",tier="durable"} 1.0' in text
    (warning,) = checkpoint_warnings(events)
    assert warning.startswith("checkpoint tier durable fell behind 1 time(s) on rank(s) 0")


def _gated_persist(loop: list[int], lag: dict[int, int]) -> Callable[..., dict[str, Any]]:
    """`persist_slot` whose persist of step s finishes once the loop has saved step s + `lag[s]`
    (else 2), and the loop then waits for it (`_settle`): the save after that reads its outcome, so
    each write takes lag + 1 steps from its launch whatever the machine's load. `loop[0]`: the newest
    step the loop saved."""
    from nvrx_eks.training.checkpoint import persist  # noqa: PLC0415

    original = persist.persist_slot

    def gated(**kwargs: Any) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while loop[0] < kwargs["step"] + lag.get(kwargs["step"], 2) and time.monotonic() < deadline:
            time.sleep(0.002)
        return original(**kwargs)

    return gated


def _settle(ckpt: TieredCheckpointer, loop: list[int], lag: dict[int, int]) -> None:
    """After the loop saved step `loop[0]`: wait until each disk write that `_gated_persist` released
    at it has finished. The writers run at a lower priority: on a loaded machine one released at a
    save could still be writing at the next save, and the write would take a step more."""
    deadline = time.monotonic() + 30
    for worker in ckpt.workers.values():
        call = getattr(worker, "inflight", None)  # disk tiers' PersistWorker; the replica has none
        if call is not None and call.step + lag.get(call.step, 2) <= loop[0]:
            call.done.wait(max(0.0, deadline - time.monotonic()))


@pytest.mark.parametrize(
    ("lag", "behind"),
    [
        pytest.param({}, False, id="every-write-3-steps"),
        pytest.param({8: 1, 12: 3}, False, id="4-steps-after-a-2-step-write"),
        pytest.param({12: 6}, True, id="first-write-7-steps"),
    ],
)
def test_a_restarted_process_judges_its_first_write_by_the_write_steps_its_snapshot_carried(
    tmp_path, monkeypatch, lag, behind
):
    """Writes take 3 steps (launch to outcome) unless `lag` says otherwise; a process restarts from
    RAM at step 10, two steps before the disk tiers' due step 12 (cadence 4, newest on disk 8). Its
    first write taking 3 steps is no lag (judged against one step, nothing measured yet in the new
    process, it read as behind at step 14), nor is 4 after predecessors' writes of 3, 3 and 2 (judged
    by the newest alone, 2, it read as behind at step 15). Taking 7, it is behind one cadence plus
    the 3 steps of the slowest recent write, and says so."""
    from nvrx_eks.localrun.summary import checkpoint_warnings  # noqa: PLC0415
    from nvrx_eks.training.checkpoint import persist  # noqa: PLC0415

    loop = [-1]
    monkeypatch.setattr(persist, "persist_slot", _gated_persist(loop, lag))
    config = every_tier(
        tmp_path / "shm", tmp_path, memory_every=2, local_every=4, durable_every=4, fsync=False
    )
    events: list[dict[str, Any]] = []

    def emit(kind: str, fields: dict[str, Any]) -> None:
        events.append({"kind": kind, "t": time.time(), **fields})

    def train(ckpt: TieredCheckpointer, steps: range, weights: torch.Tensor) -> None:
        for step in steps:
            ckpt.fence()
            weights += 1
            ckpt.save(step, {"w": weights})
            loop[0] = step
            _settle(ckpt, loop, lag)
            time.sleep(0.05)

    first = TieredCheckpointer(
        config=config, placement=Placement(rank=0, world_size=1, node_index=0, device=CPU, emit=emit)
    )
    try:
        train(first, range(12), torch.zeros(16))  # writes 0, 4, 8: each read 3 steps after its launch
    finally:
        first.close()
    loop[0] = -1
    second = TieredCheckpointer(
        config=config, placement=Placement(rank=0, world_size=1, node_index=0, device=CPU, emit=emit)
    )
    try:
        restored = second.load_latest()
        assert restored is not None
        assert (restored.step, restored.tier) == (10, "memory")
        assert set(restored.state) == {"w"}  # what the checkpointer carried is not the caller's
        train(second, range(11, 21), restored.state["w"].clone())
    finally:
        loop[0] = 1 << 30
        second.close()
    late = [e for e in events if e["kind"] == "checkpoint_behind"]
    warnings = checkpoint_warnings(events)
    if not behind:
        assert late == [], late
        assert warnings == [], warnings
        return
    assert {e["tier"] for e in late} == {"local", "durable"}, late
    assert all(e["newest_step"] == 8 and e["allowed_steps"] == 4 + 3 for e in late), late
    assert [line.split()[2] for line in warnings] == ["durable", "local"], warnings
    assert all("plus one write (3 steps): 7" in line for line in warnings), warnings


# --- real ranks ---------------------------------------------------------------------------------------
def _checkpointer(
    config: CheckpointConfig, rank: int, world_size: int, emit: Callable[[str, dict[str, Any]], None]
) -> TieredCheckpointer:
    """A gloo rank's checkpointer, one rank a node."""
    placement = Placement(rank=rank, world_size=world_size, node_index=rank, device=CPU, emit=emit)
    return TieredCheckpointer(config=config, placement=placement)


def _appending(events: list[dict[str, Any]]) -> Callable[[str, dict[str, Any]], None]:
    return lambda kind, fields: events.append({"kind": kind, **fields})


def _init(rank: int, world_size: int, root: Path, phase: str) -> None:
    import torch.distributed as dist  # noqa: PLC0415

    dist.init_process_group(
        "gloo", init_method=f"file://{root / f'pg-{phase}'}", rank=rank, world_size=world_size
    )


def _finish(ckpt: TieredCheckpointer) -> None:
    """Close, then end the process group: a gloo group alive at interpreter exit aborts the process
    ("terminate called without an active exception")."""
    import torch.distributed as dist  # noqa: PLC0415

    ckpt.close()
    dist.destroy_process_group()


def _train(
    ckpt: TieredCheckpointer,
    steps: range,
    *,
    step_s: float,
    weights: torch.Tensor,
    saved: Callable[[int], None] | None = None,
) -> None:
    """The trainer's loop shape: forward/backward (a sleep), the gradient all_reduce, fence, the
    in-place update, save (then `saved(step)`)."""
    import torch.distributed as dist  # noqa: PLC0415

    grad = torch.zeros(4)
    for step in steps:
        time.sleep(step_s)
        dist.all_reduce(grad)
        ckpt.fence()
        weights += 1.0
        ckpt.save(step, {"w": weights, "data": {"step": step}})
        if saved is not None:
            saved(step)


def _keep_up_main(rank: int, world_size: int, root: Path, _: str) -> dict[str, Any]:
    """Two nodes of one rank, the default slots, disk tiers every 4 steps, the replica every 2."""
    _init(rank, world_size, root, "keep-up")
    config = CheckpointConfig(
        memory_dir=root / f"shm-{rank}",
        memory_every=2,
        local_dir=root / f"nvme-{rank}",
        local_every=4,
        durable_dir=str(root / "durable"),
        durable_every=4,
        peer_replicas=1,
        keep=100,
        fsync=False,
    )
    events: list[dict[str, Any]] = []
    ckpt = _checkpointer(config, rank, world_size, _appending(events))
    _train(ckpt, range(24), step_s=0.08, weights=torch.zeros(256))
    ckpt.wait()
    report = {
        "slots": len(ckpt.memory.slots),
        "local": sorted(ckpt.stores[0][0].manifests(rank)),
        "durable": sorted(ckpt.stores[1][0].manifests(rank)),
        "replicated": ckpt.stats.persisted.get("peer", 0),
    }
    _finish(ckpt)
    return report


def _cut_main(rank: int, world_size: int, root: Path, phase: str) -> dict[str, Any]:
    """One node of two ranks. `first`: rank 1's step-4 persists stall mid-write and it is killed (-9)
    at step 5. `second`: both restart, restore, train steps 5-6."""
    if phase == "first" and rank == 1:
        from nvrx_eks.training.checkpoint import dcp_format, persist  # noqa: PLC0415

        write = dcp_format._CrcWriter.write

        def stalls_at_step_4(self: Any, data: Any) -> int:
            written = write(self, data)
            if persist_step[0] >= 4:
                time.sleep(120)  # the first bytes are in the writer's own folder, then it stalls
            return written

        persist_step = [0]
        original = persist.persist_slot

        def tracking(**kwargs: Any) -> dict[str, Any]:
            persist_step[0] = kwargs["step"]
            return original(**kwargs)

        dcp_format._CrcWriter.write = stalls_at_step_4
        persist.persist_slot = tracking
    os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    _init(rank, world_size, root, phase)
    config = every_tier(
        root / "shm", root, memory_every=2, local_every=4, durable_every=4, keep=2, fsync=False
    )
    events: list[dict[str, Any]] = []
    ckpt = _checkpointer(config, rank, world_size, _appending(events))
    weights = torch.zeros(256)
    if phase == "first":
        _train(ckpt, range(6), step_s=0.05, weights=weights)
        import torch.distributed as dist  # noqa: PLC0415

        if rank == 1:
            tmp = root / "local" / "step-000000004"
            deadline = time.monotonic() + 60
            while not list(tmp.glob(".rank-00001.tmp-*")) and time.monotonic() < deadline:
                time.sleep(0.05)
            dist.barrier()
            os.kill(os.getpid(), signal.SIGKILL)
        ckpt.wait()  # rank 0's own persists of step 4 commit
        dist.barrier()
        print(json.dumps({"rank": rank}), flush=True)
        os._exit(0)  # no teardown with a killed peer
    restored = ckpt.load_latest()
    assert restored is not None
    weights = restored.state["w"].clone()
    _train(ckpt, range(restored.step + 1, restored.step + 3), step_s=0.05, weights=weights)
    ckpt.wait()
    report = {
        "restored": [restored.step, restored.tier],
        "local": sorted(ckpt.stores[0][0].manifests(rank)),
        "durable": sorted(ckpt.stores[1][0].manifests(rank)),
        "cleaned": [e["path"] for e in events if e["kind"] == "checkpoint_cleaned"],
        "owed": [e["tiers"] for e in events if e["kind"] == "checkpoint_owed"],
    }
    _finish(ckpt)
    return report


def _loss_main(rank: int, world_size: int, root: Path, phase: str) -> dict[str, Any]:
    """Two nodes of one rank, the replica every 4 steps and no disk tier. `first`: steps 0-9. Then
    node 0 is lost; `second`: restore, step one more. Then node 1 is lost; `third`: restore."""
    _init(rank, world_size, root, phase)
    config = CheckpointConfig(
        memory_dir=root / f"shm-{rank}",
        memory_every=4,
        local_every=0,
        durable_every=0,
        peer_replicas=1,
        fsync=False,
    )
    events: list[dict[str, Any]] = []
    ckpt = _checkpointer(config, rank, world_size, _appending(events))
    report: dict[str, Any] = {}
    if phase == "first":
        _train(ckpt, range(10), step_s=0.05, weights=torch.zeros(64))
    else:
        restored = ckpt.load_latest()
        report["restored"] = None if restored is None else [restored.step, restored.tier]
        if phase == "second" and restored is not None:
            weights = restored.state["w"].clone()
            _train(ckpt, range(restored.step + 1, restored.step + 2), step_s=0.05, weights=weights)
    ckpt.wait()
    report["replicated"] = [
        e["step"] for e in events if e["kind"] == "checkpoint_committed" and e["tier"] == "peer"
    ]
    _finish(ckpt)
    return report


def _fail_main(rank: int, world_size: int, root: Path, _: str) -> dict[str, Any]:
    """Two ranks; rank 1's durable persist of step 8 fails; snapshots every 2 steps, durable every 8."""
    if rank == 1:
        from nvrx_eks.training.checkpoint import persist  # noqa: PLC0415

        original = persist.persist_slot

        def fails_at_step_4(**kwargs: Any) -> dict[str, Any]:
            if kwargs["step"] == 8:
                return {"ok": False, "error": "OSError: injected", "seconds": 0.0}
            return original(**kwargs)

        persist.persist_slot = fails_at_step_4
    _init(rank, world_size, root, "fail")
    config = CheckpointConfig(
        memory_dir=root / f"shm-{rank}",
        memory_every=2,
        durable_dir=str(root / "durable"),
        durable_every=8,
        keep=100,
        fsync=False,
    )
    events: list[dict[str, Any]] = []
    ckpt = _checkpointer(config, rank, world_size, _appending(events))
    _train(ckpt, range(14), step_s=0.1, weights=torch.zeros(64))
    ckpt.wait()
    report = {"durable": sorted(ckpt.stores[0][0].manifests(rank))}
    _finish(ckpt)
    return report


RESTART_EVERY = 4
RESTART_KILLED_AFTER = 11


def _restart_main(rank: int, world_size: int, root: Path, phase: str) -> dict[str, Any]:
    """Two nodes of one rank, the p5 tiers in small: RAM every 2 steps and the peer replica, NVMe
    and durable every 4; every write takes 3 steps (`_gated_persist`). `first`: steps 0-11, then,
    with step 8 on both disks, rank 1 is killed (-9): one step before the due step 12. `second`:
    both restart, restore (RAM, step 10) and train steps 11-25. Events: `<root>/run/events`."""
    from nvrx_eks.training.checkpoint import persist  # noqa: PLC0415
    from nvrx_eks.training.events import EventLog  # noqa: PLC0415

    loop = [-1]
    persist.persist_slot = _gated_persist(loop, {})
    _init(rank, world_size, root, phase)
    config = CheckpointConfig(
        memory_dir=root / f"shm-{rank}",
        memory_every=2,
        local_dir=root / f"nvme-{rank}",
        local_every=RESTART_EVERY,
        durable_dir=str(root / "durable"),
        durable_every=RESTART_EVERY,
        peer_replicas=1,
        keep=100,
        fsync=False,
    )
    log = EventLog(run_dir=root / "run", rank=rank)
    ckpt = _checkpointer(config, rank, world_size, lambda kind, fields: log.emit(kind, **fields))

    def saved(step: int) -> None:
        loop[0] = step
        _settle(ckpt, loop, {})
        log.emit("step", step=step, phase=phase)

    weights, start, report = torch.zeros(256), 0, {}
    if phase == "second":
        restored = ckpt.load_latest()
        assert restored is not None
        weights, start = restored.state["w"].clone(), restored.step + 1
        report["restored"] = [restored.step, restored.tier]
    end = RESTART_KILLED_AFTER + 1 if phase == "first" else 26
    _train(ckpt, range(start, end), step_s=0.1, weights=weights, saved=saved)
    if phase == "first":
        import torch.distributed as dist  # noqa: PLC0415

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            8 in store.manifests(rank) for store, _, _ in ckpt.stores
        ):
            time.sleep(0.05)
        dist.barrier()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        print(json.dumps({"rank": rank}), flush=True)
        os._exit(0)  # no teardown with a killed peer
    loop[0] = 1 << 30  # the writes still gated end now
    ckpt.wait()
    _finish(ckpt)
    return report


MAINS = {
    "keep-up": _keep_up_main,
    "cut": _cut_main,
    "loss": _loss_main,
    "fail": _fail_main,
    "restart": _restart_main,
}


def _run_ranks(root: Path, scenario: str, phase: str, *, world_size: int = 2) -> list[dict[str, Any]]:
    """Each rank's report once every rank has exited (a rank killed on purpose reports nothing)."""
    from children import start_python  # noqa: PLC0415 - not on the path of the ranks, which run this file

    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(
                start_python(
                    __file__,
                    scenario,
                    phase,
                    str(rank),
                    str(world_size),
                    str(root),
                    env={**os.environ, "PYTHONPATH": str(REPO)},
                )
            )
            for rank in range(world_size)
        ]
        try:
            finished = [proc.communicate(timeout=120) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
    reports = []
    for proc, (out, err) in zip(procs, finished, strict=True):
        if proc.returncode == -signal.SIGKILL:
            reports.append({"killed": True})
            continue
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def _max_gap(steps: list[int], last: int) -> int:
    points = [-1, *steps, last]
    return max(b - a for a, b in itertools.pairwise(points))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_default_slots_keep_every_disk_tier_within_a_cadence(tmp_path):
    """The p5 defaults in small: the peer replica on, local and durable tiers, no slot count. With the
    old default of 2 slots, one held for the partners' copy, the disk tiers wrote step 0 only."""
    for rank, report in enumerate(_run_ranks(tmp_path, "keep-up", "run")):
        for tier in ("local", "durable"):
            # Cadence 4: each tier's newest step is never more than a cadence and a write behind.
            assert _max_gap(report[tier], 23) <= 4 + 2, (rank, tier, report)
        assert report["replicated"] >= 10, report
        assert report["slots"] == 6, report


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_persist_cut_by_a_kill_is_redone_at_once_and_its_temporary_file_removed(tmp_path):
    """Rank 1 is killed (-9) in the middle of writing step 4 to both disk tiers; rank 0 committed
    step 4. After the restart (restored from RAM at step 4), both tiers hold a step newer than 0 on
    every rank at the first step (5), not at the next due step (8); no temporary file is left."""
    first = _run_ranks(tmp_path, "cut", "first")
    assert first[1] == {"killed": True}, first
    assert list((tmp_path / "local").glob("step-*/.rank-00001.tmp-*")), "no write was cut"
    second = _run_ranks(tmp_path, "cut", "second")
    for report in second:
        assert report["restored"] == [4, "memory"], report
        assert report["local"][-1] == report["durable"][-1] == 5, report
        assert report["owed"] == [["durable", "local"]], report
    assert second[1]["cleaned"], second[1]
    left = [p for tier in ("local", "durable") for p in (tmp_path / tier).rglob(".*tmp-*")]
    assert left == [], left


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_two_node_losses_within_one_interval_restore_from_ram(tmp_path):
    """Node 0 is lost after step 9 (restored from its partner's copy of step 8), node 1 one step
    later, before the next due snapshot (12). The restored state was replicated at once, so the
    second loss restores step 9 from RAM; without it node 1's shard had no copy anywhere."""
    _run_ranks(tmp_path, "loss", "first")
    shutil.rmtree(tmp_path / "shm-0")
    second = _run_ranks(tmp_path, "loss", "second")
    assert [r["restored"] for r in second] == [[8, "peer_memory"], [8, "memory"]], second
    assert all(9 in r["replicated"] for r in second), second
    shutil.rmtree(tmp_path / "shm-1")
    third = _run_ranks(tmp_path, "loss", "third")
    assert [r["restored"] for r in third] == [[9, "memory"], [9, "peer_memory"]], third


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_persist_that_failed_on_one_rank_is_redone_at_the_next_snapshot(tmp_path):
    """Step 8's durable shard failed on rank 1 (rank 0's committed): every rank writes the newest state
    at a snapshot once the agreement reports the failure (10, or 12 when the failure came after the
    flags were published), not at the next due step (16): no complete step from 0 to 16 on disk."""
    first, second = _run_ranks(tmp_path, "fail", "run")
    assert first["durable"][:2] == [0, 8], first
    assert second["durable"][:1] == [0], second
    redone = second["durable"][1:]
    assert redone in ([10], [12]), second
    assert first["durable"][2:] == redone, first


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_kill_just_before_a_due_step_leaves_no_disk_tier_behind(tmp_path):
    """A kill -9 after step 11 (RAM at 10, both disks at 8), the disk tiers due at 12, every write
    3 steps long. At every step of both processes, from the events, each disk tier's newest step
    every rank holds is at most one cadence plus one write old, and the report warns of nothing
    (judged against one step, the restarted process's first write read as both tiers behind at
    step 14: newest 8, 6 steps old, allowed 4 + 1)."""
    from nvrx_eks.localrun.summary import checkpoint_warnings  # noqa: PLC0415
    from nvrx_eks.training.events import read_events  # noqa: PLC0415

    first = _run_ranks(tmp_path, "restart", "first")
    assert first[1] == {"killed": True}, first
    second = _run_ranks(tmp_path, "restart", "second")
    assert [report["restored"] for report in second] == [[10, "memory"]] * 2, second
    events = read_events(tmp_path / "run")
    tiers = ("local", "durable")
    newest: dict[tuple[str, int], int] = {}
    unread: dict[int, list[tuple[str, int]]] = {0: [], 1: []}
    writes: list[tuple[str, str, int, int]] = []  # (phase, tier, step written, steps it took)
    ages: dict[tuple[str, int, str], list[int]] = {}  # (phase, step, tier) -> each rank's age
    for event in events:
        rank = event["rank"]
        if event["kind"] == "checkpoint_owed":  # after a restore: what every rank holds on disk
            for tier in tiers:
                newest[tier, rank] = event["complete"][tier]
        elif event["kind"] == "checkpoint_committed" and event["tier"] in tiers:
            newest[event["tier"], rank] = max(newest.get((event["tier"], rank), -1), event["step"])
            unread[rank].append((event["tier"], event["step"]))
        elif event["kind"] == "step":
            step, phase = event["step"], event["phase"]
            writes += [(phase, tier, written, step - written) for tier, written in unread[rank]]
            unread[rank] = []
            for tier in tiers:
                ages.setdefault((phase, step, tier), []).append(step - newest.get((tier, rank), -1))
    after = [w for w in writes if w[0] == "second"]
    first_written = {tier: min(w for _, t, w, _ in after if t == tier) for tier in tiers}
    assert first_written == {"local": 12, "durable": 12}, after  # the due step right after the kill
    assert min(took for *_, took in after) >= 3, after  # more than the one step a guess allows
    one_write = max(took for *_, took in writes)
    for (phase, step, tier), each in sorted(ages.items()):
        assert len(each) == 2, (phase, step, tier)
        assert max(each) <= RESTART_EVERY + one_write, (phase, step, tier, each, writes)
    assert [e for e in events if e["kind"] == "checkpoint_behind"] == []
    assert checkpoint_warnings(events) == []


def test_an_exchange_finished_before_an_in_process_restart_is_reported_as_it_ended(tmp_path):
    """The process group was replaced (an in-process restart) after one exchange had finished and
    while the next still ran: the first is reported as it ended (it was reported abandoned, the
    partners' copy never pinned), the second as abandoned; neither is left unreported."""
    import threading  # noqa: PLC0415

    from nvrx_eks.training.checkpoint.replica import ReplicaWorker, _Exchange  # noqa: PLC0415

    worker = ReplicaWorker(
        rank=0, world_size=2, ranks_per_node=1, replicas=1, memory_dir=tmp_path, timeout_s=5
    )
    worker._world = object()  # the group the exchanges ran on, since replaced
    finished, running = threading.Event(), threading.Event()
    finished.set()
    worker._pending.extend([_Exchange(1, 6, 1, finished), _Exchange(2, 8, 2, running)])
    worker._outcomes[1] = {"ok": True, "step": 6, "slot": 1, "seconds": 0.1}
    outcomes = [worker.poll(), worker.poll(), worker.poll()]
    assert [(o["step"], o["ok"]) for o in outcomes if o] == [(8, False), (6, True)], outcomes
    assert "abandoned" in outcomes[0]["error"]
    assert not worker.busy


if __name__ == "__main__":
    scenario, phase, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    result = MAINS[scenario](rank, world, Path(sys.argv[5]), phase)
    print(json.dumps(result), flush=True)
