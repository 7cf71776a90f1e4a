"""One run's state is that run's alone (training/run_scope.py): its identity, its memory snapshots, their
cleaning, and what a resume says on every rank's console."""

from __future__ import annotations

import json
import os
import re
import shutil
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch.distributed as dist
from children import run_python

from nvrx_eks.training.checkpoint.config import CheckpointConfig
from nvrx_eks.training.checkpoint.storage import FileStore, complete_steps
from nvrx_eks.training.resilience.config import CONFIG_ENV, RUN_ID_ENV, ResilienceConfig
from nvrx_eks.training.run_scope import RunScope, resumed_line, run_id

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store():
    return _store()


def _store() -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
    )


def test_every_rank_and_restart_of_a_run_has_its_identity_and_the_next_run_another(store, monkeypatch):
    monkeypatch.delenv(RUN_ID_ENV, raising=False)
    first = run_id(dist.PrefixStore("/worker/attempt_0", store))  # torchrun's agent store, round 0
    assert run_id(store) == first
    assert run_id(dist.PrefixStore("/worker/attempt_1", store)) == first  # a restart round of the same run
    assert run_id(_store()) != first  # the next run: its own store
    assert run_id(store, env={RUN_ID_ENV: "0b9d3c1e-job/uid"}) == "0b9d3c1e-job-uid"  # the chart's Job UID


def test_a_run_uses_its_own_memory_folder_and_removes_what_earlier_runs_of_its_folder_left(
    tmp_path, store, monkeypatch
):
    monkeypatch.setenv(RUN_ID_ENV, "second")
    cfg = ResilienceConfig(run_dir=tmp_path / "run")  # the default memory folder, keyed by the run folder
    base = cfg.effective_checkpoint().memory_dir
    neighbour = ResilienceConfig(run_dir=tmp_path / "other").effective_checkpoint().memory_dir / "run-x"
    try:
        (base / "run-first" / "rank-00000").mkdir(parents=True)  # a killed earlier run's snapshots
        (base / "rank-00000").mkdir()  # the layout before runs had folders of their own
        neighbour.mkdir(parents=True)
        rank_0 = RunScope.start(cfg, store=store, rank=0)
        rank_1 = RunScope.start(cfg, store=store, rank=1)
        assert rank_0.memory_dir == base / "run-second"
        assert sorted(p.name for p in base.iterdir()) == ["run-second"]
        assert neighbour.is_dir()  # another run folder's: not this run's to touch
        rank_0.release()
        assert rank_0.memory_dir.is_dir()  # rank 1 of this host still runs
        rank_1.release()
        assert not base.exists()
        assert neighbour.is_dir()
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(neighbour.parent, ignore_errors=True)


def test_a_rank_ending_as_the_hosts_last_other_rank_removes_the_folder_ends_without_an_error(
    tmp_path, store, monkeypatch
):
    """The ranks of a host often end at the same moment: one can find the ranks folder there and, as it
    lists it, gone, removed by the other rank that found itself last. Neither fails on it."""
    monkeypatch.setenv(RUN_ID_ENV, "together")
    cfg = ResilienceConfig(run_dir=tmp_path / "run", checkpoint=CheckpointConfig(memory_dir=tmp_path / "m"))
    rank_0 = RunScope.start(cfg, store=store, rank=0)
    rank_1 = RunScope.start(cfg, store=store, rank=1)
    listing = Path.iterdir
    ended: list[int] = []

    def rank_1_releases_first(folder: Path) -> Iterator[Path]:
        if folder.name == ".ranks" and not ended:
            ended.append(1)
            rank_1.release()  # in the moment between rank 0's unlink and its listing
        return listing(folder)

    monkeypatch.setattr(Path, "iterdir", rank_1_releases_first)
    rank_0.release()
    assert not rank_0.memory_dir.exists()


def test_a_memory_folder_the_job_gives_keeps_whatever_else_is_in_it(tmp_path, store, monkeypatch):
    monkeypatch.setenv(RUN_ID_ENV, "mine")
    given = tmp_path / "emptydir"
    (given / "run-other").mkdir(parents=True)
    cfg = ResilienceConfig(run_dir=tmp_path / "run", checkpoint=CheckpointConfig(memory_dir=given))
    scope = RunScope.start(cfg, store=store, rank=0)
    assert scope.memory_dir == given / "run-mine"
    scope.release()
    assert sorted(p.name for p in given.iterdir()) == ["run-other"]


def test_a_resume_names_its_step_and_tier_and_a_checkpoint_of_an_earlier_run():
    line = resumed_line(rank=3, attempt=0, tier="durable", step=19, where="/fsx/ckpt", written_by="abc")
    assert line.startswith(
        "rank 3: resumed after step 19 from the durable tier (/fsx/ckpt), written by an earlier"
    )
    assert "point checkpoint.durable_dir" in line
    assert line.endswith("next step 20")
    same = resumed_line(rank=1, attempt=0, tier="memory", step=8, where="/dev/shm/x", written_by=None)
    assert same == "rank 1: resumed after step 8 from the memory tier (/dev/shm/x); next step 9"
    inprocess = resumed_line(rank=0, attempt=2, tier="inprocess", step=5, where="", written_by=None)
    assert inprocess.startswith("rank 0: attempt 2 resumed after step 5 from its own memory")


_SCRIPT = """
import os, signal, sys, time
from pathlib import Path
import torch
from nvrx_eks.training import api as kit
from nvrx_eks.training.checkpoint.storage import FileStore, complete_steps

STEPS, KILL_AT = int(sys.argv[1]), int(sys.argv[2])

def durable_steps():
    root = Path(kit.load_config().effective_checkpoint().durable_dir)
    return complete_steps(FileStore(tier="durable", root=root).manifests())

def train(attempt):
    model = torch.nn.Linear(4, 4)
    wrapped = attempt.data_parallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    attempt.resume(model=model, optimizer=optimizer)
    for step in attempt.steps(STEPS):
        if step == KILL_AT:
            # The durable writes run behind the loop: on a loaded host none may have committed yet, and
            # the second run would have no earlier run's step to announce. The kill waits for one.
            deadline = time.monotonic() + 120
            while not durable_steps() and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        wrapped(torch.ones(2, 4)).sum().backward()
        with attempt.update():
            optimizer.step()

kit.Job().run(train)
"""


def _torchrun(tmp_path: Path, script: Path, *args: str, config: dict) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {RUN_ID_ENV, "RANK", "WORLD_SIZE", "MASTER_PORT"}}
    env |= {"PYTHONPATH": str(REPO), CONFIG_ENV: json.dumps(config)}
    return run_python(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(script),
        *args,
        timeout=240,
        cwd=tmp_path,
        env=env,
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_torchrun_of_a_script_never_resumes_the_first_ones_snapshot_unannounced(tmp_path):
    """The first run is killed after its RAM snapshot of step 5 (every step) and a durable checkpoint (every
    2 steps); the second, in the same folder with other arguments, starts from neither
    silently: the first's RAM snapshot belongs to the first run (and is removed), and the durable step
    it does resume is said on every rank's console as an earlier run's."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    run_dir = tmp_path / "run"
    checkpoint = {"memory_every": 1, "local_every": 0, "durable_every": 2}
    config = {"run_dir": str(run_dir), "checkpoint": checkpoint}
    base = ResilienceConfig(run_dir=run_dir).effective_checkpoint().memory_dir  # /dev/shm, this run folder's
    try:
        first = _torchrun(tmp_path, script, "10", "6", config=config)
        assert first.returncode != 0, first.stdout[-2000:] + first.stderr[-2000:]
        durable = FileStore(tier="durable", root=run_dir / "checkpoints")
        assert complete_steps(durable.manifests()), "the killed run committed no durable step"
        assert any(base.glob("run-*/rank-*")), "the killed run left no RAM snapshot: nothing to test"
        second = _torchrun(tmp_path, script, "12", "-1", config=config)
        out = second.stdout + second.stderr
        assert second.returncode == 0, out[-4000:]
        lines = [line for line in out.splitlines() if ": resumed after step" in line]
        assert len(lines) == 2, out[-4000:]  # every rank says it, on its console
        for rank in (0, 1):
            (line,) = (x for x in lines if x.startswith(f"rank {rank}: "))
            # The durable tier's newest step (its writes run behind the loop), not the RAM snapshot of 5.
            assert re.match(r"rank \d: resumed after step [0-4] from the durable tier ", line), line
            assert "written by an earlier run" in line, line
        assert not base.exists()  # the first run's snapshot removed, the second's cleaned at its end
    finally:
        shutil.rmtree(base, ignore_errors=True)
