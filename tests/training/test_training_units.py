"""Fast checks of the trainer's parts: config and CLI, schedule, data, model, metrics formulas."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
import torch

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.localrun.summary import summarize
from nvrx_eks.training.config import build_parser, parse_args
from nvrx_eks.training.data import DataSource, SyntheticTokens
from nvrx_eks.training.faults import build_schedule
from nvrx_eks.training.model import build_model
from nvrx_eks.training.parallel import wait as parallel_wait
from nvrx_eks.training.resilience.config import (
    ParallelConfig,
    ResilienceConfig,
    resilience_config,
)
from nvrx_eks.training.resilience.modes import recovering_layer
from nvrx_eks.training.resilience.shrink import ShrinkConfig
from nvrx_eks.training.trainer import emulate_device_wait

if TYPE_CHECKING:
    from nvrx_eks.training.resilience.layers import FtLauncherLayer

REPO = Path(__file__).resolve().parents[2]


def test_every_field_of_the_trainers_own_is_a_documented_flag_and_the_kits_none():
    helptext = build_parser().format_help()
    for flag in (
        "--model",
        "--steps",
        "--seed",
        "--data-batch-size",
        "--optim-lr",
        "--emulated-device-step-s",
    ):
        assert flag in helptext
    # The kit's settings reach the reference trainer as they reach any script: NVRX_EKS_CONFIG.
    for flag in ("--mode", "--run-dir", "--faults-plan", "--checkpoint-durable-dir"):
        assert f"{flag} V" not in helptext
    assert "NVRX_EKS_CONFIG" in " ".join(helptext.split())
    cfg = parse_args(["--steps", "7", "--model", "small", "--optim-lr", "0.01"])
    assert (cfg.steps, cfg.model, cfg.optim.lr) == (7, "small", 0.01)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--steps", "0"], "steps"),
        (["--model", "huge"], "unknown preset"),
        (["--nope", "1"], "unrecognized arguments"),
        (["--mode", "both"], "unrecognized arguments"),  # the kit's, not the trainer's
        (["--emulated-device-step-s", "-1"], "emulated_device_step_s"),
    ],
)
def test_bad_input_is_one_user_error(argv, needle):
    with pytest.raises(UserError, match=needle):
        parse_args(argv)


def _kit(document: dict[str, object]) -> ResilienceConfig:
    return resilience_config(document, source="NVRX_EKS_CONFIG")


@pytest.mark.parametrize(
    ("document", "needle"),
    [
        ({"mode": "inprocess", "dist": {"timeout_s": 5}}, "dist.timeout_s"),
        ({"faults": {"plan": "meteor@3"}}, "CLASS@STEP"),
        ({"inprocess": {"last_call_wait_s": 5}}, "last_call_wait_s"),
        (
            {"mode": "both", "ft": {"heartbeat_timeout_floor_s": 20}, "dist": {"timeout_s": 1}},
            "hard_timeout_s",
        ),
    ],
)
def test_bad_kit_settings_are_one_user_error(document, needle):
    with pytest.raises(UserError, match=needle):
        _kit(document)


def test_the_launcher_heartbeat_floor_covers_the_wait_for_a_restart_not_the_recovery():
    # soft 2.5 s, monitor interval 0.5 s: a rank is silent at most 3 s until its restart is decided;
    # from there to its next step the in-process layer beats for it.
    both = {"mode": "both", "inprocess": {"soft_timeout_s": 2.5}, "dist": {"timeout_s": 2}}
    assert _kit({**both, "ft": {"heartbeat_timeout_floor_s": 3.5}}).inprocess_recovery_silence_s == 3
    with pytest.raises(UserError, match=r"now 3 < 3 < 12"):
        _kit({**both, "ft": {"heartbeat_timeout_floor_s": 3}})
    # A collective timeout above the soft timeout (NCCL, which the restart aborts) adds no silence.
    gpu = {
        "mode": "both",
        "dist": {"device": "cuda", "timeout_s": 60},
        "inprocess": {"soft_timeout_s": 30, "hard_timeout_s": 180, "barrier_timeout_s": 240},
        "ft": {"heartbeat_timeout_floor_s": 35},
    }
    assert _kit(gpu).inprocess_recovery_silence_s == 30.5


def test_cli_bad_input_exits_2_without_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "nvrx_eks.training", "--steps", "-1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2
    assert "steps" in result.stderr
    assert "Traceback" not in result.stderr


def test_schedule_is_deterministic_and_spread():
    cfg = ResilienceConfig.model_validate(
        {"faults": {"count": 5, "seed": 42, "weights": {"exception": 0.6, "hang": 0.4}}}
    )
    first = build_schedule(cfg.faults, steps=100, world_size=4, seed=0)
    again = build_schedule(cfg.faults, steps=100, world_size=4, seed=0)
    assert first == again
    assert len(first) == 5
    assert {f.cls for f in first} <= {"exception", "hang"}
    steps = [f.step for f in first]
    assert all(b - a >= 1 for a, b in itertools.pairwise(steps))
    assert all(2 <= s <= 99 for s in steps)
    other = ResilienceConfig.model_validate({"faults": {"count": 5, "seed": 43}})
    assert build_schedule(other.faults, steps=100, world_size=4, seed=0) != first


def test_layers_follow_the_mode():
    assert recovering_layer("exception", "both") == "inprocess"
    assert recovering_layer("exception", "ft_launcher") == "ft_launcher"
    assert recovering_layer("deadlock", "both") == "ft_launcher"
    assert recovering_layer("node_loss", "both") == "job_controller"
    assert recovering_layer("sigkill", "baseline") == "torchrun"
    assert recovering_layer("exception", "baseline") == "torchrun"
    assert recovering_layer("sigkill", "inprocess") == "ft_launcher"


def test_data_is_keyed_by_sample_index():
    source = SyntheticTokens(seed=3, vocab_size=256, seq_len=16)
    data = DataSource(source=source, batch_size=2, world_size=4)
    batch = data.batch(5, 2, torch.device("cpu"))
    assert torch.equal(batch.inputs[1], source.sample(data.first_sample(5, 2) + 1)[:-1])
    assert torch.equal(data.batch(5, 2, torch.device("cpu")).inputs, batch.inputs)
    assert not torch.equal(data.batch(5, 3, torch.device("cpu")).inputs, batch.inputs)


@pytest.mark.parametrize("ranks", [4, 3, 2, 1])
def test_a_shrunk_jobs_ranks_share_the_full_global_batch_exactly_once_with_weights_that_keep_its_mean(ranks):
    """16 nodes' worth of samples per step on fewer ranks: every sample of the step's global batch read
    by exactly one rank, in micro-batches of at most the full size's, and the weights (each micro-batch's
    samples x ranks / global batch) average to the global batch's mean over the ranks."""
    source = SyntheticTokens(seed=3, vocab_size=256, seq_len=4)
    data = DataSource(source=source, batch_size=3, world_size=4)
    seen, weights = [], []
    for rank in range(ranks):
        for batch, weight in data.share(7, rank, ranks, torch.device("cpu")):
            assert len(batch.inputs) <= 3
            seen += [row.tolist() for row in batch.inputs]
            weights.append((weight, len(batch.inputs)))
    expected = [source.sample(7 * 12 + i)[:-1].tolist() for i in range(12)]
    assert seen == expected
    # Each sample's weight in the averaged gradient: weight / samples-in-its-micro-batch / ranks = 1/12.
    assert all(abs(w / n / ranks - 1 / 12) < 1e-12 for w, n in weights)
    if ranks == 4:  # the full size: one micro-batch each, weight 1, the samples `batch` reads
        assert [w for w, _ in weights] == [1.0] * 4
        assert data.share(7, 2, 4, torch.device("cpu"))[0][0].inputs.equal(
            data.batch(7, 2, torch.device("cpu")).inputs
        )


def test_a_shrink_closes_at_the_largest_size_the_nodes_present_fill_and_the_layout_runs_at():
    parallel = ParallelConfig(mesh={"dp": -1, "tp": 4})
    # 8 ranks a node, tp 4 inside a node: every node count runs; down to 12.
    assert parallel.node_counts(16, 8, down_to=12) == [15, 14, 13, 12]
    # A pipeline dimension outside data parallelism: the world must be a multiple of 3 x 8 ranks.
    assert ParallelConfig(mesh={"pp": 3, "dp": -1, "tp": 8}).node_counts(16, 8, down_to=10) == [15, 12]
    shrink = ShrinkConfig(nodes=16, node_counts=[15, 12], after_s=60)
    assert [shrink.size_for(n) for n in (16, 15, 14, 12, 11)] == [15, 15, 12, 12, None]
    assert ShrinkConfig().enabled is False


def test_tiny_model_is_deterministic_and_learns_shape():
    a = build_model("tiny", seed=1, device=torch.device("cpu"))
    b = build_model("tiny", seed=1, device=torch.device("cpu"))
    for (_, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb)
    logits = a(torch.zeros(2, 32, dtype=torch.long))
    assert logits.shape == (2, 32, 256)


def _write(run_dir: Path, rank: int, events: list[dict]) -> None:
    path = run_dir / "events" / f"rank-{rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        for event in events:
            fh.write(json.dumps({"rank": rank, "restart": 0, "node": "0", **event}) + "\n")


def test_summarize_applies_the_formulas(tmp_path):
    # One rank, 10 steps of 1 s; a hard fault at t=5.5 after step 4; restart restores step 3; t=20 end.
    ev = [
        {"t": 0.0, "kind": "process_start", "pid": 1, "mode": "both", "steps": 10},
        {
            "t": 1.0,
            "kind": "startup_done",
            "pid": 1,
            "restored_step": -1,
            "tier": "none",
            "state_bytes": 1000,
            "memcpy_gbps": 1e-6,
        },
    ]
    ev += [
        {"t": 1.0 + s + 1, "kind": "step", "pid": 1, "step": s, "step_s": 1.0, "ckpt_s": 0.1}
        for s in range(5)
    ]
    ev += [{"t": 6.5, "kind": "checkpoint_committed", "pid": 1, "step": 3}]
    ev += [
        {
            "t": 6.6,
            "kind": "fault_injected",
            "pid": 1,
            "class": "sigkill",
            "step": 5,
            "target_rank": 0,
            "expected_layer": "ft_launcher",
            "index": 0,
        },
        {"t": 8.0, "kind": "process_start", "pid": 2, "mode": "both", "steps": 10},
        {
            "t": 9.6,
            "kind": "startup_done",
            "pid": 2,
            "restored_step": 3,
            "tier": "durable",
            "state_bytes": 1000,
            "memcpy_gbps": 1e-6,
        },
    ]
    ev += [
        {"t": 9.6 + i + 1, "kind": "step", "pid": 2, "step": s, "step_s": 1.0, "ckpt_s": 0.1}
        for i, s in enumerate(range(4, 10))
    ]
    ev += [{"t": 16.0, "kind": "end", "pid": 2, "steps": 10, "final_params_sha256": "abc"}]
    _write(tmp_path, 0, ev)
    summary = summarize(tmp_path)
    assert summary.completed
    assert summary.wall_s == pytest.approx(16.0)
    assert summary.productive_steps == 10
    assert summary.replayed_steps == 1
    assert summary.training_goodput == pytest.approx(10 / 16)
    assert summary.infra_goodput == pytest.approx((16 - 3.0) / 16)
    assert summary.checkpoint_efficiency == pytest.approx(1 - 1.1 / 16)
    assert summary.stall_ratio == pytest.approx(1.1 / 1 / (1000 / 1000))
    (fault,) = summary.faults
    assert fault.layer == "ft_launcher"
    assert fault.detect_s == pytest.approx(1.4)
    assert fault.recovery_s == pytest.approx(3.0)
    assert fault.steps_lost == 1
    assert summary.to_dict()["faults"][0]["class"] == "sigkill"


def test_a_step_rank_0_caught_up_from_a_rank_ahead_completes_the_run(tmp_path):
    # Rank 0 was a step behind at an in-process restart and took step 2 from rank 1: it never trained
    # step 2 itself, but the run did.
    def events(rank: int) -> list[dict]:
        ev: list[dict] = [
            {"t": 0.0, "kind": "process_start", "pid": 1 + rank, "mode": "both"},
            {"t": 0.1, "kind": "loop_start", "pid": 1 + rank, "steps": 4},
        ]
        steps = [0, 1, 3] if rank == 0 else [0, 1, 2, 3]
        ev += [{"t": 1.0 + s, "kind": "step", "pid": 1 + rank, "step": s, "step_s": 1.0} for s in steps]
        if rank == 0:
            ev.append({"t": 3.5, "kind": "caught_up", "pid": 1, "source": 1, "from_step": 1, "to_step": 2})
        return [*ev, {"t": 5.0, "kind": "end", "pid": 1 + rank, "steps": 4, "final_params_sha256": "abc"}]

    for rank in (0, 1):
        _write(tmp_path, rank, events(rank))
    summary = summarize(tmp_path)
    assert summary.completed
    assert (summary.productive_steps, summary.replayed_steps) == (4, 0)


def test_the_wall_breakdown_names_every_second_once(tmp_path):
    """One rank: 3 steps, a SIGKILL in the 4th, a restore of step 1 (step 2 replayed), 3 more steps.
    Each step 1.0 s plus 0.1 s in checkpoint calls plus 0.05 s of loop between steps."""
    start = {"kind": "startup_done", "tier": "none", "state_bytes": 1000, "memcpy_gbps": 1.0}
    ev = [{"t": 0.0, "kind": "process_start", "pid": 1, "mode": "both", "steps": 5}]
    ev += [{"t": 0.5, "pid": 1, "restored_step": -1, **start}]
    ev += [
        {"t": 0.5 + 1.15 * (s + 1), "kind": "step", "pid": 1, "step": s, "step_s": 1.0, "ckpt_s": 0.1}
        for s in range(3)
    ]
    fault = {"class": "sigkill", "step": 3, "target_rank": 0, "expected_layer": "ft_launcher", "index": 0}
    ev += [{"t": 4.25, "kind": "fault_injected", "pid": 1, **fault}]  # 0.3 s into step 3
    ev += [{"t": 5.0, "kind": "process_start", "pid": 2, "mode": "both", "steps": 5}]
    ev += [{"t": 6.25, "pid": 2, "restored_step": 1, **start, "tier": "memory"}]  # recovery: 2.0 s
    ev += [
        {"t": 6.25 + 1.15 * (i + 1), "kind": "step", "pid": 2, "step": s, "step_s": 1.0, "ckpt_s": 0.1}
        for i, s in enumerate(range(2, 5))
    ]
    ev += [{"t": 9.7, "kind": "end", "pid": 2, "steps": 5, "final_params_sha256": "abc"}]
    _write(tmp_path, 0, ev)
    summary = summarize(tmp_path)
    parts = summary.wall_breakdown()
    assert parts == pytest.approx(
        {
            "productive": 5.0,
            "replayed": 1.0,
            "checkpoint_stall": 0.6,
            "recovery": 2.0,
            "startup": 0.5,
            # 6 x 0.05 s between steps, 0.3 s of the faulted step before its fault
            "other": 0.6,
        }
    )
    assert sum(parts.values()) == pytest.approx(summary.wall_s)
    assert summary.to_dict()["wall_breakdown_s"] == parts
    assert summary.training_goodput == pytest.approx(parts["productive"] / summary.wall_s)


def test_rng_state_restores_from_a_view():
    # Restored tensors are views into one shard buffer; torch reads a generator state from the start
    # of the storage, so the trainer clones it (a view at an offset crashed a restarted rank: SIGSEGV).
    from nvrx_eks.training.checkpoint.shard import decode, to_bytes  # noqa: PLC0415

    torch.manual_seed(7)
    expected = torch.get_rng_state()
    blob = bytearray(to_bytes({"pad": torch.ones(1000), "rng": {"torch": expected}}))
    view = decode(blob)["rng"]["torch"]
    assert view.storage_offset() > 0  # the case that crashed
    torch.manual_seed(8)
    torch.set_rng_state(view.clone())
    assert torch.equal(torch.get_rng_state(), expected)


def test_gradient_average_is_one_flat_all_reduce_in_parameter_order(tmp_path):
    import torch.distributed as dist  # noqa: PLC0415

    from nvrx_eks.training.parallel import World, start_average_gradients  # noqa: PLC0415

    model = build_model("tiny", seed=0, device=torch.device("cpu"))
    model(torch.zeros(2, 32, dtype=torch.long)).sum().backward()
    before = [p.grad.clone() for p in model.parameters()]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        world = World(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
        pending = start_average_gradients(model, world)  # a one-rank group standing in for two: sum / 2
        assert pending is not None
        parallel_wait(pending.work)
        pending.finish()
    finally:
        dist.destroy_process_group()
    for grad, old in zip((p.grad for p in model.parameters()), before, strict=True):
        assert torch.equal(grad, old / 2)


def test_help_does_not_import_torch_for_the_model_presets():
    code = "import sys, training.shapes, training.config; print('nvrx_eks.training.model' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


class _RestartSignal(Exception):  # noqa: N818 - stands in for NVRx's RankShouldRestart
    pass


def test_emulated_device_wait_yields_to_an_in_process_restart():
    """NVRx's monitor thread stops the main thread with an asynchronous exception, which Python only
    delivers between bytecodes: a 5 s emulated device wait must end long before its time."""
    main = threading.get_ident()

    def interrupt() -> None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main), ctypes.py_object(_RestartSignal))

    timer = threading.Timer(0.1, interrupt)
    timer.start()
    started = time.perf_counter()
    with pytest.raises(_RestartSignal):
        emulate_device_wait(5.0)
    timer.join()
    assert time.perf_counter() - started < 2.0


def _raise_in(thread_id: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(_RestartSignal))


class _CollectiveCompletingUnderARestart:
    """A gradient collective that completes on the third look, at the moment a restart is decided."""

    def __init__(self, restart_decided: threading.Event) -> None:
        self.looks = 0
        self.restart_decided = restart_decided

    def is_completed(self) -> bool:
        self.looks += 1
        if self.looks < 3:
            return False
        self.restart_decided.set()
        time.sleep(0.05)  # the monitor thread is now waiting to raise
        return True

    def finish(self) -> None:
        return None


def test_update_is_applied_once_its_collective_completed_even_when_a_restart_is_decided(monkeypatch):
    """The race a CI run lost a step to: peers finished step N's all-reduce and ran on into N+1, where
    one failed; this rank, slower, had its collective complete but was stopped before its update, so
    the ranks disagreed on the step and all rolled back to a snapshot. The stop must land either
    before the completion (the rank then never updates, nor can its peers) or after the update."""
    from nvidia_resiliency_ext.inprocess import CallWrapper  # noqa: PLC0415

    from nvrx_eks.training.resilience.layers import InProcessLayer  # noqa: PLC0415

    # NVRx's own atomic section and monitor-thread protocol: raise into the main thread under the lock.
    call_wrapper = SimpleNamespace(atomic_lock=threading.RLock())
    call_wrapper.atomic = lambda: CallWrapper.atomic(call_wrapper)
    layer = InProcessLayer.__new__(InProcessLayer)
    layer.call_wrapper = call_wrapper
    restart_decided = threading.Event()
    main = threading.get_ident()

    def monitor() -> None:
        restart_decided.wait(5)
        with call_wrapper.atomic_lock:
            _raise_in(main)

    import torch  # noqa: PLC0415

    from nvrx_eks.training import parallel  # noqa: PLC0415
    from nvrx_eks.training.attempt import AttemptRun, Record  # noqa: PLC0415
    from nvrx_eks.training.tracked import Tracked  # noqa: PLC0415

    updates: list[int] = []
    context = SimpleNamespace(
        world=parallel.World(rank=0, world_size=2, local_rank=0, device=torch.device("cpu")),
        resilience=layer,
        checkpointer=SimpleNamespace(fence=lambda: None),
    )
    attempt = AttemptRun(context, Record())  # type: ignore[arg-type]
    model = torch.nn.Linear(1, 1)
    attempt.tracked, attempt.kit_parallel, attempt.step, attempt.last_done = (
        Tracked({"model": model}),
        [model],
        5,
        4,
    )
    collective = _CollectiveCompletingUnderARestart(restart_decided)
    monkeypatch.setattr(parallel, "start_average_gradients", lambda module, world: collective)

    def update_then_run_on() -> None:
        with attempt.update(loss=None, clip_grad_norm=None):
            updates.append(5)
        deadline = time.monotonic() + 5  # the restart lands once the atomic section is left
        while time.monotonic() < deadline:
            time.sleep(0.01)

    thread = threading.Thread(target=monitor)
    thread.start()
    with pytest.raises(_RestartSignal):
        update_then_run_on()
    thread.join()
    assert (updates, attempt.last_done) == ([5], 5)


_STOPPED_IN_A_NATIVE_WAIT = """
import sys
from datetime import timedelta
from pathlib import Path
from torch.distributed import TCPStore
from nvrx_eks.training.events import EventLog
from nvrx_eks.training.resilience.layers import install_termination_handler

install_termination_handler(EventLog(run_dir=Path(sys.argv[1]), rank=0))
store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60))
print("waiting", flush=True)
store.wait(["never-set"], timedelta(seconds=60))  # as a rank waits in a barrier on a dead peer
"""


def test_a_rank_stopped_while_it_waits_in_native_code_leaves_at_once(tmp_path):
    """A Python handler alone runs only when the main thread's native wait returns (here after 60 s);
    the launcher's SIGTERM must end the rank, recorded, while it waits."""
    with subprocess.Popen(
        [sys.executable, "-c", _STOPPED_IN_A_NATIVE_WAIT, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "waiting"
            time.sleep(0.5)  # inside the store's wait
            proc.terminate()
            code = proc.wait(timeout=30)  # half the wait's own timeout: not the wait ending by itself
        finally:
            proc.kill()
    assert code == 128 + 15
    (events,) = (tmp_path / "events").glob("rank-0.jsonl")
    assert json.loads(events.read_text().splitlines()[-1])["kind"] == "terminated"


def test_a_process_creation_time_is_when_it_was_started_not_up_to_a_second_before():
    """The worker-start phase begins at the OS's creation time; psutil's rounds the boot time down to
    a whole second, which moved up to 1 s of each restart from the rendezvous phase into the start."""
    before = time.time()
    done = subprocess.run(
        [sys.executable, "-c", "from training.events import process_created_at; print(process_created_at())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=REPO,
    )
    after = time.time()
    created = float(done.stdout.strip())
    assert before - 0.02 <= created <= after  # the kernel's tick is 10 ms


def _ft_layer(client: object, *, beat_s: float = 0.5, beats_for_s: float = 30.0) -> FtLauncherLayer:
    """The ft_launcher layer around `client` (a stand-in for RankMonitorClient, which needs a launcher),
    as a rank has it once it has beaten from a step."""
    from nvrx_eks.training.resilience.layers import FtLauncherLayer  # noqa: PLC0415

    layer = FtLauncherLayer.__new__(FtLauncherLayer)
    layer.client, layer.events = client, SimpleNamespace(emit=lambda *_, **__: None)
    layer.attempts, layer.steps_this_attempt, layer.restored = 0, 0, True
    layer.recovery_beat_s, layer.recovery_beats_for_s = beat_s, beats_for_s
    layer._sending, layer._beating = threading.Lock(), True
    layer._recovering, layer._beats_until = threading.Event(), 0.0
    layer._beater, layer._beater_lock = None, threading.Lock()
    layer._atomic = contextlib.nullcontext
    return layer


def test_a_recovering_rank_beats_every_interval_until_its_next_step_and_no_longer():
    """From a restart's decision to the rank's next step the launcher hears from the rank every
    in-process interval, however long the recovery; then only its steps beat, and a recovery that
    outlasts the in-process barrier timeout stops beating (NVRx ends such a restart)."""
    beats: list[float] = []
    client = SimpleNamespace(send_heartbeat=lambda: beats.append(time.monotonic()))
    layer = _ft_layer(client, beat_s=0.05, beats_for_s=0.6)
    layer.beat_while_recovering()  # the monitor thread, as the restart is decided
    time.sleep(0.4)
    layer.beat_while_recovering()  # the main thread, as the next attempt starts
    time.sleep(0.4)
    layer.step_done(0)
    recovering = len(beats)
    time.sleep(0.3)
    assert len(beats) == recovering  # the step beat last: nothing after it
    gaps = [later - earlier for earlier, later in itertools.pairwise(beats)]
    assert recovering >= 5, beats  # 0.8 s at 0.05 s: two beats only, at the decision and the attempt
    assert max(gaps) < 0.5, gaps  # never silent for the length of the recovery
    # A recovery that never reaches a step: beats until the barrier timeout, then silence.
    beats.clear()
    layer.beat_while_recovering()
    time.sleep(1.0)
    assert beats, beats
    assert beats[-1] - beats[0] < 0.7, beats


class _OneRequestAtATime:
    """A stand-in for RankMonitorClient's socket: counts requests that overlap another one (each is a
    request and its reply on one socket; two at once put the socket out of step)."""

    CURRENT_TIMEOUTS_STATE_KEY = "current_timeouts"

    def __init__(self) -> None:
        self.hb_timeouts = SimpleNamespace(initial=1.0, subsequent=1.0)
        self.requests, self.overlaps = 0, 0
        self._busy = threading.Lock()

    def _request(self) -> None:
        if not self._busy.acquire(blocking=False):
            self.overlaps += 1
            return
        self.requests += 1
        time.sleep(0.002)
        self._busy.release()

    def send_heartbeat(self) -> None:
        self._request()

    def load_state_dict(self, state: object) -> None:
        self._request()

    def _set_calculated_timeouts(self, new_hb_timeouts: object, new_section_timeouts: object) -> None:
        self._request()


def test_restoring_the_launchers_timeouts_never_overlaps_a_recovery_beat():
    """The restore of an in-process restart's next attempt sends the launcher its timeouts while the
    recovery beats are still on; unserialized, a request met a beat on the socket ("Unexpected reply",
    then a broken pipe), and the rank failed its restore twice: a job failed as a bug in the script."""
    client = _OneRequestAtATime()
    layer = _ft_layer(client, beat_s=0.001)
    layer.cfg = SimpleNamespace(
        initial_timeout_floor_s=1.0, heartbeat_timeout_floor_s=1.0, calc_timeouts_after=5
    )
    layer.beat_while_recovering()
    checkpoint = {
        "ft": {client.CURRENT_TIMEOUTS_STATE_KEY: {"heartbeat": {"initial": 1.0, "subsequent": 1.0}}}
    }
    for _ in range(100):
        layer.load_state_dict(checkpoint)
    layer.step_done(0)
    assert client.requests + client.overlaps > 200  # restores and beats both ran, side by side
    assert client.overlaps == 0, client.overlaps


def test_the_main_threads_requests_to_the_launcher_run_where_no_in_process_restart_interrupts_them():
    """The in-process restart is raised into the main thread wherever it is. Landing inside a request
    to the launcher (the restore of its timeouts, a step's heartbeat, their calculation), it left the
    socket out of step; the launcher's side closed it ("invalid load key"), and the next attempt's
    restore failed on a broken pipe twice: the job failed as a bug in the script."""
    from nvrx_eks.training.resilience.layers import Layer, Resilience  # noqa: PLC0415

    in_section: list[bool] = []
    seen: list[bool] = []

    class _RestartsHere(Layer):  # the in-process layer's atomic section
        @contextlib.contextmanager
        def atomic(self):
            in_section.append(True)
            try:
                yield
            finally:
                in_section.pop()

    class _Client(_OneRequestAtATime):
        def _request(self) -> None:
            seen.append(bool(in_section))
            super()._request()

        def calculate_and_set_hb_timeouts(self, *, skip_if_not_ready: bool) -> bool:
            self._request()
            return True

    client = _Client()
    ft = _ft_layer(client)
    ft.restored = False
    ft.cfg = SimpleNamespace(
        initial_timeout_floor_s=1.0, heartbeat_timeout_floor_s=1.0, calc_timeouts_after=1
    )
    resilience = Resilience([_RestartsHere(), ft])
    resilience.load_state_dict(
        {"ft": {client.CURRENT_TIMEOUTS_STATE_KEY: {"heartbeat": {"initial": 1.0, "subsequent": 1.0}}}}
    )
    ft.restored = False
    resilience.step_done(0)  # a heartbeat, then the calculation
    assert len(seen) >= 4, seen
    assert all(seen), seen


def test_the_launcher_stops_expecting_heartbeats_once_training_returns_not_after_the_teardown():
    """The outer layers' teardown (the in-process Wrapper's barriers and monitor process) sends no
    heartbeat and once outlasted the launcher's heartbeat timeout: the launcher killed every rank of a
    finished job. Monitoring ends as the last step's run returns, before any outer teardown; a run that
    fails keeps it (the rank may be restarted)."""
    calls: list[str] = []
    layer = _ft_layer(SimpleNamespace(shutdown_workload_monitoring=lambda: calls.append("monitoring ends")))

    def with_teardown(run):  # an outer layer: its attempt, then its teardown
        def wrapped():
            result = run()
            calls.append("teardown")
            return result

        return wrapped

    assert with_teardown(layer.wrap(lambda: calls.append("last step") or "digest"))() == "digest"
    assert calls == ["last step", "monitoring ends", "teardown"]
    assert layer._beating is False  # a late beat from the in-process monitor thread is not sent

    calls.clear()
    layer.attempts, layer._beating = 0, True

    def fails():
        raise RuntimeError("a collective failed")

    with pytest.raises(RuntimeError):
        with_teardown(layer.wrap(fails))()
    assert calls == []


def test_the_kits_waits_after_the_last_step_keep_every_layer_told_the_rank_is_alive():
    """What a rank waits on after its last step (its last persists, the last barrier for the slowest
    rank) sends no step's ping or heartbeat: without these beats, a wait longer than the in-process
    soft timeout restarted ranks of a finished job whose other ranks had left (a job that then hung)."""
    from nvrx_eks.training.resilience.layers import Layer, Resilience  # noqa: PLC0415

    class Counting(Layer):
        def __init__(self, *, fails: bool = False) -> None:
            self.beats: list[str] = []
            self.fails = fails

        def alive(self) -> None:
            self.beats.append(threading.current_thread().name)
            if self.fails:
                raise RuntimeError("the monitor's queue is closed")

    failing, counting = Counting(fails=True), Counting()
    with Resilience([failing, counting]).kept_alive(0.05):
        time.sleep(0.6)
    after = len(counting.beats)
    time.sleep(0.2)
    assert len(counting.beats) == after, "beats after the wait ended"
    assert after >= 5, counting.beats  # one every interval, about 12 in 0.6 s; a failing layer stops none
    assert len(failing.beats) == after
    assert threading.main_thread().name not in counting.beats
