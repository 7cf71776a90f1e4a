"""The trainer's Prometheus metrics: names by convention, replays, recoveries by layer and phase, tiers."""

from __future__ import annotations

import json
import re

import pytest
from children import run_python
from prometheus_client.parser import text_string_to_metric_families

from nvrx_eks.training.events import EventLog
from nvrx_eks.training.metrics import RANK_PHASES, Metrics


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    metrics.write()
    text = metrics.path.read_text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"rank": "0", **labels}.items())))
    return samples[key]


_OPEN: list[EventLog] = []


@pytest.fixture(autouse=True)
def _close_logs():
    yield
    while _OPEN:
        _OPEN.pop().close()


def _new(run_dir, **kwargs) -> tuple[Metrics, EventLog]:
    events = EventLog(run_dir=run_dir, rank=0)
    _OPEN.append(events)
    metrics = Metrics(
        run_dir=run_dir, rank=0, every=1000, port=None, local_rank=0, tokens_per_step=64, **kwargs
    )
    events.subscribe(metrics.observe)
    return metrics, events


def _steps(metrics: Metrics, events: EventLog, steps: range) -> None:
    for step in steps:
        events.emit("step", step=step, step_s=0.5, ckpt_s=0.01, loss=1.0)
        metrics.step(step=step, step_s=0.5, ckpt_s=0.01, loss=1.0)


def test_names_follow_prometheus_conventions(tmp_path):
    metrics, _ = _new(tmp_path)
    names = metrics.metric_names()
    assert "trainer_steps_total" in names
    assert "trainer_checkpoint_stall_seconds_total" in names
    assert "trainer_step_seconds_bucket" in names
    for name in names:
        assert re.fullmatch(r"trainer_[a-z0-9_]+", name), name
    families = {f.name: f.type for f in metrics.registry.collect()}
    for name, kind in families.items():
        if kind == "counter":  # the exposition adds _total; time counters are in seconds
            assert not name.endswith("_total"), name
        if "seconds" in name or "time" in name:
            assert re.search(r"_seconds$|_timestamp_seconds$", name), name


def test_in_process_recovery_counts_its_layer_and_phases(tmp_path):
    metrics, events = _new(tmp_path)
    events.emit("process_ready", setup_s=3.0)
    events.emit("attempt_start", attempt=0)
    events.emit("startup_done", attempt=0, restored_step=-1, tier="none", startup_s=1.0, load_s=0.1)
    _steps(metrics, events, range(5))
    events.emit("checkpoint_staged", tier="memory", step=4)
    events.emit("checkpoint_committed", tier="durable", step=4, seconds=2.0)
    events.emit("checkpoint_skipped", tier="local", step=4, reason="previous persist running")
    events.emit("fault_injected", **{"class": "exception"}, step=5, target_rank=0)
    events.emit("detected", layer="inprocess", cause="InjectedFaultError")
    events.emit("attempt_start", attempt=1)
    events.emit("startup_done", attempt=1, restored_step=4, tier="inprocess", startup_s=0.4, load_s=0.05)
    _steps(metrics, events, range(5, 7))
    samples = _samples(metrics)
    assert _value(samples, "trainer_steps_total") == 7
    assert _value(samples, "trainer_productive_steps_total") == 7
    assert _value(samples, "trainer_productive_step_seconds_total") == pytest.approx(3.5)
    assert _value(samples, "trainer_tokens_total") == 7 * 64
    # The first start is no recovery; the in-process restart is one, restored from memory.
    assert _value(samples, "trainer_recoveries_total", layer="inprocess", tier="inprocess") == 1
    assert ("trainer_recoveries_total", (("layer", "none"),)) not in samples
    for phase in ("teardown", "rendezvous", "restore", "first_step"):
        assert _value(samples, "trainer_recovery_phase_seconds_count", layer="inprocess", phase=phase) == 1
    assert _value(samples, "trainer_recovery_phase_seconds_sum", layer="inprocess", phase="restore") == 0.05
    assert _value(samples, "trainer_recovery_phase_seconds_sum", layer="inprocess", phase="rendezvous") == (
        pytest.approx(0.35)
    )
    assert _value(samples, "trainer_checkpoint_last_step", tier="durable") == 4
    assert _value(samples, "trainer_checkpoint_persist_seconds_sum", tier="durable") == 2.0
    assert _value(samples, "trainer_checkpoint_last_success_timestamp_seconds", tier="memory") > 1e9
    assert _value(samples, "trainer_checkpoint_skipped_total", tier="local") == 1
    assert _value(samples, "trainer_faults_injected_total", **{"class": "exception"}) == 1


def test_a_step_without_its_loss_keeps_the_last_loss(tmp_path):
    metrics, events = _new(tmp_path)
    _steps(metrics, events, range(3))
    metrics.step(step=3, step_s=0.5, ckpt_s=0.0, loss=float("nan"))  # cut by a restart, or not read yet
    samples = _samples(metrics)
    assert _value(samples, "trainer_loss") == 1.0
    assert _value(samples, "trainer_productive_steps_total") == 4


def test_a_launcher_restart_replays_steps_and_counts_as_ft_launcher(tmp_path):
    metrics, events = _new(tmp_path)
    _steps(metrics, events, range(6))  # the first process reached step 5, then died
    events.close()
    metrics, events = _new(tmp_path, restart_count=1)
    events.emit("process_ready", setup_s=4.2)
    events.emit("attempt_start", attempt=0)
    events.emit("startup_done", attempt=0, restored_step=2, tier="memory", startup_s=2.0, load_s=0.5)
    _steps(metrics, events, range(3, 8))
    samples = _samples(metrics)
    assert _value(samples, "trainer_replayed_steps_total") == 3  # 3, 4, 5 again
    assert _value(samples, "trainer_productive_steps_total") == 2
    assert _value(samples, "trainer_launcher_restarts") == 1
    assert _value(samples, "trainer_recoveries_total", layer="ft_launcher", tier="memory") == 1
    assert _value(samples, "trainer_recovery_phase_seconds_sum", layer="ft_launcher", phase="start") == 4.2
    assert set(RANK_PHASES) >= {"start", "restore"}


def test_a_replacement_pod_restoring_a_checkpoint_is_the_job_controllers(tmp_path):
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "rank-0.jsonl").write_text(
        json.dumps({"t": 1.0, "kind": "step", "step": 9}) + "\n" + '{"t": 2.0, "kind": "st'  # torn tail
    )
    metrics, events = _new(tmp_path)
    assert metrics.high_water == 9
    events.emit("startup_done", attempt=0, restored_step=8, tier="durable", startup_s=3.0, load_s=1.0)
    samples = _samples(metrics)
    assert _value(samples, "trainer_recoveries_total", layer="job_controller", tier="durable") == 1


def test_a_failing_listener_never_stops_the_event_stream(tmp_path):
    events = EventLog(run_dir=tmp_path, rank=0)
    events.subscribe(lambda _event: 1 / 0)
    events.emit("step", step=0)
    events.close()
    assert '"step"' in (tmp_path / "events" / "rank-0.jsonl").read_text()


def test_each_tier_publishes_its_interval_and_counts_from_zero(tmp_path):
    """The stale-checkpoint alert divides by the interval; the dashboard's increase() over skips and
    failures reads 0 before the first one, not no data."""
    from nvrx_eks.training.checkpoint.config import CheckpointConfig  # noqa: PLC0415
    from nvrx_eks.training.metrics import checkpoint_intervals  # noqa: PLC0415

    config = CheckpointConfig(
        memory_every=2, local_dir=tmp_path, local_every=10, durable_dir=None, peer_replicas=1
    )
    assert checkpoint_intervals(config) == {"memory": 2, "peer": 2, "local": 10}
    assert checkpoint_intervals(config.model_copy(update={"implementation": "sync", "peer_replicas": 0})) == {
        "local": 10
    }
    metrics = Metrics(
        run_dir=tmp_path,
        rank=3,
        every=1,
        port=None,
        local_rank=1,
        checkpoint_intervals={"memory": 2, "local": 10},
    )
    metrics.write()
    text = (tmp_path / "metrics" / "rank-3.prom").read_text()
    assert 'trainer_checkpoint_interval_steps{rank="3",tier="memory"} 2.0' in text
    assert 'trainer_checkpoint_interval_steps{rank="3",tier="local"} 10.0' in text
    for name in ("trainer_checkpoint_skipped_total", "trainer_checkpoint_failures_total"):
        assert f'{name}{{rank="3",tier="local"}} 0.0' in text


def test_a_rank_serves_metrics_on_the_pod_address_only(tmp_path, monkeypatch, reserve_port):
    """Two local pods' ranks with the same local rank share a port, each on its own loopback address."""
    import socket  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    from nvrx_eks.training.metrics import METRICS_HOST_ENV  # noqa: PLC0415

    port = reserve_port()
    monkeypatch.setenv(METRICS_HOST_ENV, "127.0.0.3")
    Metrics(run_dir=tmp_path / "a", rank=0, every=1, port=port, local_rank=0)
    monkeypatch.setenv(METRICS_HOST_ENV, "127.0.0.4")
    Metrics(run_dir=tmp_path / "b", rank=2, every=1, port=port, local_rank=0)
    for address, rank in (("127.0.0.3", "0"), ("127.0.0.4", "2")):
        with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=10) as answer:
            assert f'trainer_process_start_time_seconds{{rank="{rank}"}}' in answer.read().decode()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # not on every interface


def test_a_ranks_metrics_port_is_free_once_the_rank_ends_though_a_process_forked_from_it_lives(
    tmp_path, reserve_port
):
    """NVRx's in-process monitor is forked from the rank and can outlive it. Its copy of the listening
    socket kept the port bound, so the rank's restarted successor on the same local rank could not bind
    it (EADDRINUSE) and its launcher restarted it until the job failed (`make observe-check`: 10 rank
    targets of 5 pods, the store closed, where 6 of 3 succeed)."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import socket  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from nvrx_eks.training.metrics import METRICS_HOST_ENV  # noqa: PLC0415

    port = reserve_port()
    rank = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from training.metrics import Metrics\n"
        f"Metrics(run_dir=Path({str(tmp_path)!r}), rank=0, every=1, port={port}, local_rank=0)\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    null = os.open(os.devnull, os.O_WRONLY)\n"  # the test reads the rank's output to its end
        "    os.dup2(null, 1)\n"
        "    os.dup2(null, 2)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(child, flush=True)\n"
        "os._exit(0)\n"  # the rank ends at once, as a stopped worker does; its fork lives on
    )
    done = run_python(
        "-c",
        rank,
        timeout=60,
        env={**os.environ, METRICS_HOST_ENV: "127.0.0.1", "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    child = int(done.stdout.split()[-1])
    try:
        with socket.socket() as successor:  # as the next worker's server binds: address reuse on
            successor.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            successor.bind(("127.0.0.1", port))
            successor.listen()
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_taken_metrics_port_waits_for_its_holder_and_never_stops_the_rank(caplog, reserve_port):
    import socket  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from prometheus_client import CollectorRegistry  # noqa: PLC0415

    from nvrx_eks.training.metrics import serve_metrics  # noqa: PLC0415

    port = reserve_port()
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    # A predecessor still exiting: the port comes free within the wait.
    threading.Timer(0.5, holder.close).start()
    assert serve_metrics(CollectorRegistry(), host="127.0.0.1", port=port, wait_s=10)
    # Another process keeps it: this rank trains on, unscraped, and says why.
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        assert not serve_metrics(CollectorRegistry(), host="127.0.0.1", port=taken, wait_s=0.3)
    assert f"port {taken} on 127.0.0.1 is still in use" in caplog.text
