"""The script owns its parallelism: its own DDP, FSDP2 and tensor parallelism on the attempt's device
mesh, checkpoints in torch.distributed.checkpoint format that resume at another world size, and the
misuses a GPU user meets told plainly on CPU."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nvrx_eks.localrun.torchrun import standalone

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _torchrun(args: list[str], *, ranks: int, config: dict | None = None, timeout: int = 300) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("NVRX_EKS_CONFIG", None)
    if config is not None:
        env["NVRX_EKS_CONFIG"] = json.dumps(config)
    done = subprocess.run(
        standalone(ranks=ranks, entry=args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_scripts_own_ddp_trains_exactly_as_under_plain_torchrun(tmp_path):
    """Four ranks, the same DDP script: plain torchrun, and under the kit (mode baseline, no fault):
    the kit averages nothing itself and zeroes, clips and steps as the script would, bit for bit."""
    plain = _torchrun([str(SCRIPTS / "ddp_twice.py"), "plain"], ranks=4)
    kit = _torchrun(
        [str(SCRIPTS / "ddp_twice.py"), "kit"], ranks=4, config={"run_dir": str(tmp_path / "run")}
    )
    digests = [
        line.split()[1] for out in (plain, kit) for line in out.splitlines() if line.startswith("sha256")
    ]
    assert len(digests) == 2
    assert digests[0] == digests[1]


def _tp_config(run_dir: Path) -> dict:
    return {
        "run_dir": str(run_dir),
        "parallel": {"mesh": {"dp": -1, "tp": 2}},
        "checkpoint": {
            "memory_dir": str(run_dir / "shm"),
            "memory_every": 2,
            "local_dir": str(run_dir / "local"),
            "local_every": 4,
            "durable_every": 4,
            "fsync": False,
        },
    }


def _events(run_dir: Path, kind: str) -> list[dict]:
    return [
        event
        for path in sorted((run_dir / "events").glob("rank-*.jsonl"))
        for event in map(json.loads, path.read_text().splitlines())
        if event["kind"] == kind
    ]


def _sha256(state: dict[str, torch.Tensor]) -> str:
    """The kit's final-parameters digest (training/attempt.py `params_sha256`), written out: a reader of
    the checkpoint owes the kit nothing."""
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


_PLAIN_DCP = """
import sys, json
import torch, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from transformers import LlamaForCausalLM
from examples.hf_llama.train import MODEL
model = LlamaForCausalLM(MODEL)
state = {"model": get_model_state_dict(model)}
dcp.load(state, checkpoint_id=sys.argv[1])
torch.save(state["model"], sys.argv[2])
"""


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(600)
def test_a_checkpoint_of_4_ranks_resumes_on_2_and_back_and_plain_dcp_reads_it(tmp_path):
    """FSDP2 x tensor parallelism (examples/hf_llama_tp) on 4 ranks, a (dp 2, tp 2) mesh; resumed by the
    kit on 2 ranks (dp 1, tp 2), then on 4 again, each training on; the durable step loads in one
    process with plain torch.distributed.checkpoint, no kit code, into the state the kit trained."""
    run = tmp_path / "run"
    module = ["-m", "examples.hf_llama_tp.train"]
    _torchrun([*module, "--steps", "9"], ranks=4, config=_tp_config(run))
    final = json.loads((run / "final.json").read_text())
    assert final["steps"] == 9
    step_dir = run / "checkpoints" / "step-000000008"
    assert (step_dir / ".metadata").is_file()  # the global metadata: every rank's part committed
    out = tmp_path / "plain.pt"
    done = subprocess.run(
        [sys.executable, "-c", _PLAIN_DCP, str(step_dir), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert _sha256(torch.load(out)) == final["final_params_sha256"]

    before = {e["pid"] for e in _events(run, "process_start")}
    _torchrun([*module, "--steps", "13"], ranks=2, config=_tp_config(run))
    restored = [e for e in _events(run, "checkpoint_restored") if e["pid"] not in before]
    assert len(restored) == 2
    assert {(e["tier"], e["step"], e["resharded"], e["from_world_size"]) for e in restored} == {
        ("durable", 8, True, 4)
    }
    steps = [e["step"] for e in _events(run, "step") if e["pid"] == restored[0]["pid"]]
    assert steps == list(range(9, 13))

    before = {e["pid"] for e in _events(run, "process_start")}
    _torchrun([*module, "--steps", "17"], ranks=4, config=_tp_config(run))
    restored = [e for e in _events(run, "checkpoint_restored") if e["pid"] not in before]
    assert len(restored) == 4
    assert {(e["tier"], e["step"], e["from_world_size"]) for e in restored} == {("durable", 12, 2)}
    assert json.loads((run / "final.json").read_text())["steps"] == 17


# ----- misuse, told plainly --------------------------------------------------------------------------


def _one_rank_attempt(tmp_path: Path, *trains, **config) -> None:
    """Each of `trains` as one attempt of a one-rank job (an in-process restart between them)."""
    import torch.distributed as dist  # noqa: PLC0415
    from training_attempts import Record, attempt, stub_context  # noqa: PLC0415

    from nvrx_eks.training import api, parallel  # noqa: PLC0415

    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    world = parallel.World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    ctx = stub_context(api.ResilienceConfig(run_dir=run_dir, **config), world, run_dir)
    record = Record()
    try:
        for train in trains:
            attempt(ctx, record, train)
    finally:
        parallel.release_retired_groups()
        if dist.is_initialized():
            dist.destroy_process_group()
        ctx.events.close()


def test_an_optimizer_built_before_the_model_was_sharded_is_refused_naming_the_fix(tmp_path):
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415

    def train(attempt):
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.AdamW(model.parameters())  # before fully_shard replaced the parameters
        fully_shard(model, mesh=attempt.device_mesh())
        attempt.resume(model=model, optimizer=optimizer)

    with pytest.raises(UserError, match="built before fully_shard / parallelize_module replaced them"):
        _one_rank_attempt(tmp_path, train)


def test_a_mesh_that_does_not_fit_the_world_names_both_layouts(tmp_path):
    from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415

    with pytest.raises(
        UserError, match=r"parallel.mesh: mesh \{dp=-1, tp=2\} needs a multiple of 2 ranks, this job has 1"
    ):
        _one_rank_attempt(
            tmp_path, lambda attempt: attempt.device_mesh(), parallel={"mesh": {"dp": -1, "tp": 2}}
        )
    with pytest.raises(
        UserError, match=r"attempt.device_mesh\(\): mesh \{dp=2\} needs a multiple of 2 ranks"
    ):
        _one_rank_attempt(tmp_path, lambda attempt: attempt.device_mesh({"dp": 2}))


def test_a_model_sharded_on_an_earlier_attempts_mesh_is_refused(tmp_path):
    """A script that keeps its sharded model across attempts would run the next attempt's collectives on
    destroyed process groups: said at resume, before any collective hangs on them."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415

    models = []

    def first(attempt):
        model = torch.nn.Linear(4, 4)
        fully_shard(model, mesh=attempt.device_mesh({"dp": 1, "tp": 1}))
        models.append(model)  # kept for the next attempt: the misuse
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        attempt.resume(model=model, optimizer=optimizer)
        for _ in attempt.steps(1):
            with attempt.update():
                optimizer.step()

    def second(attempt):
        model = models[0]  # sharded over the first attempt's mesh
        attempt.resume(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))

    with pytest.raises(UserError, match="sharded over a device mesh of an earlier attempt"):
        _one_rank_attempt(tmp_path, first, second)


def _fsdp_tp_run(tmp_path: Path, *, stop: int | None) -> tuple[str | None, list[dict]]:
    """FSDP2 over `dp` and tensor parallelism over `tp` on one rank's (1, 1) mesh, with a scheduler:
    `stop` ends the first attempt after that step's backward, as an in-process restart does."""
    import contextlib  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: PLC0415
    from training_attempts import Record, attempt, stub_context  # noqa: PLC0415

    from nvrx_eks.training import api, parallel  # noqa: PLC0415

    class Stopped(Exception):  # noqa: N818 - stands in for the in-process restart's interrupt
        pass

    def train(attempt_: api.Attempt, *, stop_at: int | None) -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8), torch.nn.Tanh()
        )
        mesh = attempt_.device_mesh({"dp": 1, "tp": 1})
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
        attempt_.resume(model=model, optimizer=optimizer, scheduler=scheduler)
        for step in attempt_.steps(8):
            inputs = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
            model(inputs).pow(2).mean().backward()
            if step == stop_at:
                raise Stopped
            with attempt_.update(clip_grad_norm=0.5):
                optimizer.step()
                scheduler.step()

    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    world = parallel.World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    ctx, record = stub_context(api.ResilienceConfig(run_dir=run_dir), world, run_dir), Record()
    try:
        if stop is not None:
            with contextlib.suppress(Stopped):
                attempt(ctx, record, lambda a: train(a, stop_at=stop))
        digest = attempt(ctx, record, lambda a: train(a, stop_at=None))
    finally:
        parallel.release_retired_groups()
        if dist.is_initialized():
            dist.destroy_process_group()
        ctx.events.close()
    return digest, _events(run_dir, "startup_done")


def test_an_in_process_restart_of_a_sharded_model_takes_its_state_from_memory_exactly(tmp_path):
    """The next attempt builds its model, mesh and optimizer anew; each tensor (DTensor shards, the
    optimizer's moments) and the scheduler's counters come from the previous attempt's objects."""
    clean, _ = _fsdp_tp_run(tmp_path / "clean", stop=None)
    faulted, starts = _fsdp_tp_run(tmp_path / "faulted", stop=4)
    assert [(e["attempt"], e["tier"], e["restored_step"]) for e in starts] == [
        (0, "none", -1),
        (1, "inprocess", 3),
    ]
    assert faulted == clean


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_groups_connect_ranks_that_start_seconds_apart_and_keep_the_short_collective_timeout(tmp_path):
    """gloo bounds a group's connection by the group's timeout: with the collective timeout (2 s in the
    local values) a rank that started 3 s after its peer on a loaded machine failed the whole attempt
    (`connectFullMesh`). The attempt's groups connect within a minute, then a collective still fails
    within its own timeout."""
    script, store = SCRIPTS / "late_peer.py", tmp_path / "store"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    late = subprocess.Popen(
        [sys.executable, str(script), "1", str(store)], stdout=subprocess.DEVNULL, env=env
    )
    try:
        first = subprocess.run(
            [sys.executable, str(script), "0", str(store)],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=100,
        )
        late.wait(timeout=30)
    finally:
        late.kill()
    out = first.stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report.get("default group") == report.get("mesh") == "connected", report
    assert 0.5 <= report["lone collective failed after s"] < 10, report
