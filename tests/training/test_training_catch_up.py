"""An in-process restart that stops ranks inside a step: what landed is kept and counted once.

Two real gloo ranks run the reference trainer through the public API's attempts.

- Caught a step apart: rank 1 applies step 3's update; rank 0's all-reduce for step 3 completes but its
  update does not happen (as when the restart stops it between the two), so the ranks are one step apart
  when the next attempt starts. Nothing may be lost: both ranks must resume from memory at step 3, and
  the final parameters must equal an uninterrupted run's.
- Cut after the update: both ranks apply step 3's update and are stopped before the step's end (its
  snapshot, as when a peer's fault aborts the snapshot's collective). The step is trained, the next
  attempt goes on after it: each rank must count it once, or the run looks a step short.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import time
from pathlib import Path

import pytest

STEPS = 6
LAG_STEP = 3
WORLD_SIZE = 2


_PRELOAD = ("torch", "torch.distributed", "nvrx_eks.training.api", "nvrx_eks.training.config")
"""What the ranks' forkserver imports once (the pytest worker keeps one forkserver, whichever test
starts it)."""


class _Stopped(Exception):  # noqa: N818 - stands in for the in-process restart's interrupt
    pass


def _rank(rank: int, run_dir: str, *, lag: bool, cut: bool = False) -> None:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    from training_attempts import Record, attempt, stub_context  # noqa: PLC0415

    from nvrx_eks.training import api, parallel  # noqa: PLC0415
    from nvrx_eks.training.config import parse_args  # noqa: PLC0415
    from nvrx_eks.training.resilience.config import ResilienceConfig  # noqa: PLC0415
    from nvrx_eks.training.trainer import ReferenceTrainer  # noqa: PLC0415

    root = Path(run_dir)
    cfg = parse_args(["--steps", str(STEPS), "--model", "tiny"])  # the trainer's own
    kit = ResilienceConfig.model_validate({"run_dir": run_dir, "mode": "baseline"})  # the kit's
    world = parallel.World(rank=rank, world_size=WORLD_SIZE, local_rank=rank, device=torch.device("cpu"))
    context, record = stub_context(kit, world, root), Record()
    trainer = ReferenceTrainer(cfg)
    if lag:

        def lagging(attempt: api.Attempt) -> None:
            # The first attempt, stopped as an in-process restart stops it: rank 0 after its step-3
            # all-reduce completed but before its update; rank 1 after its step-3 update, in step 4.
            update = attempt.update

            @contextlib.contextmanager
            def stopped_update(**kwargs: object):
                if attempt._run.step == LAG_STEP and rank == 0:
                    with update(**kwargs):  # type: ignore[arg-type]
                        raise _Stopped
                if attempt._run.step == LAG_STEP + 1:  # rank 1, before the next collective
                    raise _Stopped
                with update(**kwargs):  # type: ignore[arg-type]
                    yield

            attempt.update = stopped_update  # type: ignore[method-assign]
            trainer(attempt)

        with contextlib.suppress(_Stopped):
            attempt(context, record, lagging)
    if cut:

        def cut_after_update(attempt: api.Attempt) -> None:
            update = attempt.update

            @contextlib.contextmanager
            def update_then_stop(**kwargs: object):
                with update(**kwargs):  # type: ignore[arg-type]
                    yield
                if attempt._run.step == LAG_STEP:  # the update landed; the step's end is not reached
                    raise _Stopped

            attempt.update = update_then_stop  # type: ignore[method-assign]
            trainer(attempt)

        with contextlib.suppress(_Stopped):
            attempt(context, record, cut_after_update)
    digest = attempt(
        context, record, trainer
    )  # the next attempt (or the only one), then the rest of the steps
    (root / f"digest-{rank}.json").write_text(json.dumps({"digest": digest}))
    parallel.release_retired_groups()
    dist.destroy_process_group()


def _run(run_dir: Path, *, lag: bool, cut: bool = False) -> list[dict]:
    run_dir.mkdir(parents=True)
    # Forked from a server that imported torch and the kit once, not two fresh interpreters per run.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(_PRELOAD))
    procs = [
        ctx.Process(target=_rank, args=(r, str(run_dir)), kwargs={"lag": lag, "cut": cut})
        for r in range(WORLD_SIZE)
    ]
    for proc in procs:
        proc.start()
    try:
        deadline = time.monotonic() + 120
        # A rank that fails leaves its peer waiting in a collective: stop at the first failure.
        while time.monotonic() < deadline and any(p.is_alive() for p in procs):
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
        assert [p.exitcode for p in procs] == [0] * WORLD_SIZE
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    return [
        json.loads(line)
        for rank in range(WORLD_SIZE)
        for line in (run_dir / "events" / f"rank-{rank}.jsonl").read_text().splitlines()
    ]


def _digests(run_dir: Path) -> set[str]:
    return {json.loads((run_dir / f"digest-{r}.json").read_text())["digest"] for r in range(WORLD_SIZE)}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_rank_one_step_behind_catches_up_from_a_rank_ahead(tmp_path):
    events = _run(tmp_path / "lagged", lag=True)
    restarts = [e for e in events if e["kind"] == "startup_done" and e["attempt"] == 1]
    assert sorted((e["rank"], e["tier"], e["restored_step"]) for e in restarts) == [
        (0, "inprocess", LAG_STEP),
        (1, "inprocess", LAG_STEP),
    ]
    (caught_up,) = [e for e in events if e["kind"] == "caught_up"]
    assert (caught_up["rank"], caught_up["source"], caught_up["from_step"]) == (0, 1, LAG_STEP - 1)
    # Each step trained once per rank: nothing replayed.
    for rank in range(WORLD_SIZE):
        steps = [e["step"] for e in events if e["kind"] == "step" and e["rank"] == rank]
        assert steps == [*range(LAG_STEP + rank), *range(LAG_STEP + 1, STEPS)]

    _run(tmp_path / "reference", lag=False)
    assert _digests(tmp_path / "lagged") == _digests(tmp_path / "reference")
    assert len(_digests(tmp_path / "reference")) == 1


@pytest.mark.timeout(120)
def test_a_step_cut_after_its_update_is_kept_and_counted_once(tmp_path):
    events = _run(tmp_path / "cut", lag=False, cut=True)
    restarts = [e for e in events if e["kind"] == "startup_done" and e["attempt"] == 1]
    assert sorted((e["rank"], e["tier"], e["restored_step"]) for e in restarts) == [
        (0, "inprocess", LAG_STEP),
        (1, "inprocess", LAG_STEP),
    ]
    for rank in range(WORLD_SIZE):
        steps = [e for e in events if e["kind"] == "step" and e["rank"] == rank]
        assert [e["step"] for e in steps] == list(range(STEPS)), rank
        assert [e["step"] for e in steps if e.get("cut")] == [LAG_STEP], rank
