"""The public API's front door: its configuration, its entry shim and its bad-input messages, as a user's
script meets them (one rank, a real process, the message and exit code a rank would give)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from children import run_python

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.training import api
from nvrx_eks.training.entry import resolve
from nvrx_eks.training.resilience.config import CONFIG_ENV

if TYPE_CHECKING:
    from collections.abc import Callable

REPO = Path(__file__).resolve().parents[2]


def test_the_config_comes_from_the_charts_json_variable(tmp_path):
    document = {"mode": "baseline", "run_dir": str(tmp_path), "checkpoint": {"memory_every": 5}}
    config = api.load_config({CONFIG_ENV: json.dumps(document)})
    assert (config.mode, config.run_dir, config.checkpoint.memory_every) == ("baseline", tmp_path, 5)
    assert api.load_config({}) == api.ResilienceConfig()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", f"{CONFIG_ENV} is not a JSON object"),
        ("[1, 2]", f"{CONFIG_ENV} is not a JSON object"),
        ('{"checkpoint": {"memory_every": -1}}', "checkpoint.memory_every"),
        ('{"model": "tiny"}', "model"),  # the reference trainer's field: not the kit's
    ],
)
def test_a_bad_config_variable_is_one_message_naming_the_field(raw, message):
    with pytest.raises(UserError, match=message):
        api.load_config({CONFIG_ENV: raw})


def test_the_entry_shim_names_what_does_not_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"entrypoint.module no_such_package.train: .*install your package"):
        resolve(["--module", "no_such_package.train"])
    with pytest.raises(UserError, match=r"entrypoint.script missing.py: no such file"):
        resolve(["--script", "missing.py", "--steps", "3"])
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert resolve(["--script", "train.py", "--steps", "3"]) == (
        "script",
        str(tmp_path / "train.py"),
        ["--steps", "3"],
    )
    assert resolve(["--module", "json.tool", "-h"]) == ("module", "json.tool", ["-h"])


_PRELUDE = """
import sys, torch
from nvrx_eks.training import api as kit

def build():
    model = torch.nn.Linear(4, 4)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)
"""
_MISUSES = {
    "not_stateful": (
        """
def train(attempt):
    model, optimizer = build()
    attempt.resume(model=model, optimizer=optimizer, data=[1, 2, 3])
""",
        "data: a list has no state_dict()/load_state_dict()",
    ),
    "data_parallel_after_resume": (
        """
def train(attempt):
    model, optimizer = build()
    attempt.resume(model=model, optimizer=optimizer)
    attempt.data_parallel(model)
""",
        "attempt.data_parallel() after attempt.resume(): wrap the model first",
    ),
    "steps_before_resume": (
        """
def train(attempt):
    for step in attempt.steps(3):
        pass
""",
        "attempt.steps() before attempt.resume()",
    ),
    "update_outside_steps": (
        """
def train(attempt):
    model, optimizer = build()
    attempt.resume(model=model, optimizer=optimizer)
    with attempt.update():
        optimizer.step()
""",
        "attempt.update() outside attempt.steps()",
    ),
    "step_without_update": (
        """
def train(attempt):
    model, optimizer = build()
    attempt.resume(model=model, optimizer=optimizer)
    for step in attempt.steps(10):
        model(torch.ones(1, 4)).sum().backward()
""",
        "step 0 ended without attempt.update()",
    ),
    "no_loop": (
        """
def train(attempt):
    model, optimizer = build()
    attempt.resume(model=model, optimizer=optimizer)
""",
        "returned without running attempt.steps(N)",
    ),
    "fault_past_the_loop": (
        """
def train(attempt):
    model, optimizer = build()
    attempt.resume(model=model, optimizer=optimizer)
    for step in attempt.steps(5):
        with attempt.update():
            optimizer.step()
""",
        "faults.plan: 'exception@9' is at step 9, but the run's steps are 0..4",
    ),
}


@pytest.mark.parametrize("case", sorted(_MISUSES))
def test_an_api_call_out_of_order_is_one_message_and_exit_2(case, tmp_path):
    body, message = _MISUSES[case]
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_PRELUDE) + textwrap.dedent(body) + "\nkit.Job().run(train)\n")
    config = {"run_dir": str(tmp_path / "run"), "faults": {"plan": ["exception@9"]}}
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "MASTER_PORT"}}
    env |= {CONFIG_ENV: json.dumps(config), "PYTHONPATH": str(REPO)}
    done = run_python(str(script), env=env, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-3000:]
    assert message in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]


class _Interrupted(Exception):  # noqa: N818 - stands in for the in-process restart's interrupt
    pass


def _batchnorm_run(run_dir: Path, *, fail_at: int | None) -> str | None:
    """A model with BatchNorm (its forward moves running statistics, outside any update) trained for 10
    steps through the API's attempts; `fail_at`: the first attempt stops after that step's forward, as
    an in-process restart would stop it, and the next attempt resumes from memory."""
    import contextlib  # noqa: PLC0415

    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from training_attempts import Record, attempt, stub_context  # noqa: PLC0415

    from nvrx_eks.training import parallel  # noqa: PLC0415

    run_dir.mkdir(parents=True)
    config = api.ResilienceConfig(run_dir=run_dir)
    world = parallel.World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    context, record = stub_context(config, world, run_dir), Record()

    def train(attempt: api.Attempt, *, stop: int | None) -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        attempt.resume(model=model, optimizer=optimizer)
        for step in attempt.steps(10):
            inputs = torch.randn(16, 4, generator=torch.Generator().manual_seed(step))
            loss = model(inputs).pow(2).mean()
            if step == stop:
                raise _Interrupted
            loss.backward()
            with attempt.update():
                optimizer.step()

    try:
        if fail_at is not None:
            with contextlib.suppress(_Interrupted):
                attempt(context, record, lambda a: train(a, stop=fail_at))
        return attempt(context, record, lambda a: train(a, stop=None))
    finally:
        parallel.release_retired_groups()
        dist.destroy_process_group()
        context.events.close()


def test_an_in_process_restart_rewinds_buffers_a_forward_moved(tmp_path):
    """BatchNorm's running statistics change in the forward, outside `update()`: the failed step's
    forward moved them, and resuming from memory must take the boundary's, or the run drifts."""
    assert _batchnorm_run(tmp_path / "faulted", fail_at=6) == _batchnorm_run(tmp_path / "clean", fail_at=None)


def _linear_steps(run: api.Attempt, steps: int, *, bug_at: int | None = None) -> None:
    """A one-layer model trained for `steps` through the API; `bug_at`: that step raises, every time."""
    import torch  # noqa: PLC0415

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run.resume(model=model, optimizer=optimizer)
    for step in run.steps(steps):
        if step == bug_at:
            raise ValueError(f"a bug at step {bug_at}")
        model(torch.ones(1, 2)).sum().backward()
        with run.update():
            optimizer.step()


def test_the_last_barrier_tells_the_layers_once_every_rank_has_finished_training(tmp_path):
    """The in-process layer declines a restart decided once every rank has finished (its test with
    NVRx's real Wrapper: tests/training/test_training_nvrx_compat.py); the attempt's end tells it when,
    before it waits at the last barrier: not yet on arrival, then once every rank has arrived."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from training_attempts import Record, attempt, stub_context  # noqa: PLC0415

    from nvrx_eks.training import parallel  # noqa: PLC0415
    from nvrx_eks.training.resilience.layers import Layer, Resilience  # noqa: PLC0415

    class Told(Layer):
        def __init__(self) -> None:
            self.done: list[Callable[[], bool]] = []
            self.on_arrival: list[bool] = []

        def finished_when(self, done: Callable[[], bool]) -> None:
            self.done.append(done)
            self.on_arrival.append(done())

    told = Told()
    world = parallel.World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    context = stub_context(api.ResilienceConfig(run_dir=tmp_path), world, tmp_path)
    context.resilience = Resilience([told])

    try:
        attempt(context, Record(), lambda run: _linear_steps(run, 2))
    finally:
        parallel.release_retired_groups()
        dist.destroy_process_group()
        context.events.close()
    assert told.on_arrival == [False]
    assert [done() for done in told.done] == [True]


def test_a_fault_leaving_the_attempt_starts_the_recovery_beats_and_a_bug_does_not(tmp_path):
    """NVRx decides an in-process restart only once a rank's record has gone through its monitor
    process and the store; a rank blocked in a collective sees the fault only at the collective
    timeout. Under load the launcher's heartbeat timeout ran out first and killed a rank the restart
    was about to recover (the raising rank's peer). The beats now start as the fault leaves the
    attempt; a bug seen twice ends the job, and starts none."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from training_attempts import Record, attempt, stub_context  # noqa: PLC0415

    from nvrx_eks.training import parallel  # noqa: PLC0415
    from nvrx_eks.training.events import EventLog  # noqa: PLC0415
    from nvrx_eks.training.resilience.layers import InProcessLayer, Layer, Resilience  # noqa: PLC0415

    class Told(Layer):
        def __init__(self) -> None:
            self.failed = 0

        def attempt_failed(self) -> None:
            self.failed += 1

    told = Told()
    config = api.ResilienceConfig(run_dir=tmp_path, mode="both", inprocess={"store_port": 29999})
    world = parallel.World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    context, record = stub_context(config, world, tmp_path), Record()
    context.resilience = Resilience([told])

    def train(run: api.Attempt) -> None:
        _linear_steps(run, 4, bug_at=2)

    try:
        with pytest.raises(ValueError, match="a bug at step 2"):
            attempt(context, record, train)
        assert told.failed == 1  # a first failure is a fault: retried, in process
        with pytest.raises(UserError):
            attempt(context, record, train)
        assert told.failed == 1  # the same failure again: the script's bug, the job ends
    finally:
        parallel.release_retired_groups()
        dist.destroy_process_group()
        context.events.close()

    # The in-process layer passes it on as the recovery beats' start (ft_launcher's, in mode both).
    beats: list[str] = []
    events = EventLog(run_dir=tmp_path / "layer", rank=0)
    layer = InProcessLayer(
        config, events, store=None, world=world, on_restart_decided=lambda: beats.append("on")
    )
    layer.attempt_failed()
    events.close()
    assert beats == ["on"]
