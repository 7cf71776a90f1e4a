"""kill -9 torture: a rank is killed at random points while it persists; every resume must come from
the newest checkpoint committed in any tier at the moment of the kill, with exactly its contents.

Each trial starts a child rank that first resumes (reporting the step, tier and whether the state
matches what that step saved), then keeps saving with all tiers on until the parent SIGKILLs its
whole process group at a random moment. The parent computes the expected resume step itself, by
reading the committed manifests left behind, before starting the next child.

Trials are cheap on purpose (a small state suffices to tear files): children are forked from a
multiprocessing fork server that imported torch and this package once, so a trial pays only for the
random kill delay, not for a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import torch

from nvrx_eks.bench.checkpoint.benchstate import every_tier
from nvrx_eks.training.checkpoint.slot import committed
from nvrx_eks.training.checkpoint.stats import logger as checkpoint_logger

if TYPE_CHECKING:
    from pathlib import Path

STATE_ELEMENTS = 1 << 18  # 1 MiB of float32 per tensor: big enough that writes take a while


def expected_state(step: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(STATE_ELEMENTS, generator=generator), "b": torch.full((7,), float(step))},
        "data": {"step": step},
    }


def newest_committed(root: Path) -> int | None:
    """The newest step with a committed manifest in any tier (read from the files, not the loader)."""
    steps: list[int] = []
    for folder in (root / "shm").glob("rank-*"):
        steps.extend(manifest["step"] for _, manifest in committed(folder))
    for tier in ("local", "durable"):
        for manifest in (root / tier).glob("step-*/rank-*.json"):
            try:
                steps.append(json.loads(manifest.read_text())["step"])
            except (OSError, ValueError, KeyError):
                continue
    return max(steps, default=None)


EVENTS_LOG = "events.log"
"""Where the trials' children log the checkpointer's events, one readable line each: a rank killed at
random leaves its tiers behind on purpose, so the parent counts them by kind instead of showing each."""


def _log_events_to(path: Path) -> None:
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    checkpoint_log = logging.getLogger(checkpoint_logger.name)
    checkpoint_log.addHandler(handler)
    checkpoint_log.propagate = False


def event_counts(root: Path) -> dict[str, int]:
    """How many events of each kind the trials' children logged (`EVENTS_LOG`)."""
    try:
        lines = (root / EVENTS_LOG).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return {}
    return dict(Counter(line.split(" ", 1)[0] for line in lines if line.strip()))


def child(root: Path, delay_s: float, report_path: Path) -> None:
    os.setsid()  # its own process group: the parent's killpg takes the whole child
    from nvrx_eks.training.checkpoint.base import Placement  # noqa: PLC0415
    from nvrx_eks.training.checkpoint.stats import make_emitter  # noqa: PLC0415
    from nvrx_eks.training.checkpoint.tiered import TieredCheckpointer  # noqa: PLC0415

    _log_events_to(root / EVENTS_LOG)
    config = every_tier(
        root / "shm", root, memory_every=1, local_every=1, durable_every=2, keep=2, persist_timeout_s=60
    )
    ckpt = TieredCheckpointer(
        config=config,
        placement=Placement(
            rank=0, world_size=1, node_index=0, device=torch.device("cpu"), emit=make_emitter(None)
        ),
        persist_delay_s=delay_s,
    )
    restored = ckpt.load_latest()  # while the writers start
    report: dict[str, Any] = {"step": None}
    if restored is not None:
        want = expected_state(restored.step)
        same = torch.equal(restored.state["model"]["w"], want["model"]["w"]) and torch.equal(
            restored.state["model"]["b"], want["model"]["b"]
        )
        report = {
            "step": restored.step,
            "tier": restored.tier,
            "exact": same and restored.state["data"] == want["data"],
        }
    tmp = report_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report))
    deadline = time.monotonic() + 120
    while not all(worker.warm() for worker in ckpt.workers.values()) and time.monotonic() < deadline:
        time.sleep(0.02)  # kill during persists, not during the writers' start
    tmp.replace(report_path)  # "ready": the parent's kill clock starts now
    step = (restored.step if restored else 0) + 1
    while True:
        ckpt.save(step, expected_state(step))
        ckpt.fence()
        step += 1
        time.sleep(0.02)


def _fork_server() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(
        ["torch", "nvrx_eks.training.checkpoint.tiered", "nvrx_eks.training.checkpoint.factory"]
    )
    return context


def run_trials(*, root: Path, trials: int, seed: int = 0, max_kill_s: float = 1.5) -> dict[str, Any]:
    """Run `trials` kill -9 trials; returns counts (ok, wrong step, inexact state, no resume)."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible kill schedule, not security
    counts = {"trials": 0, "ok": 0, "wrong_step": 0, "inexact": 0, "failed_start": 0}
    failures: list[dict[str, Any]] = []
    expected: int | None = None
    context = _fork_server()
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for trial in range(trials + 1):  # the last child only reports the final resume
        delay = rng.choice([0.0, 0.01, 0.05])
        report_path = root / f"report-{trial}.json"
        proc = context.Process(target=child, args=(root, delay, report_path), daemon=False)
        proc.start()
        try:
            deadline = time.monotonic() + 120
            while not report_path.exists() and proc.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            if trial:
                counts["trials"] += 1
                try:
                    report = json.loads(report_path.read_text())
                except (OSError, ValueError) as exc:
                    counts["failed_start"] += 1
                    failures.append({"trial": trial, "error": str(exc), "exitcode": proc.exitcode})
                    report = None
                if report is not None:
                    if report["step"] != expected:
                        counts["wrong_step"] += 1
                        failures.append({"trial": trial, "expected": expected, **report})
                    elif report["step"] is not None and not report["exact"]:
                        counts["inexact"] += 1
                        failures.append({"trial": trial, **report})
                    else:
                        counts["ok"] += 1
            if trial == trials:
                break
            time.sleep(rng.uniform(0.05, max_kill_s))
        finally:
            if proc.pid is not None and proc.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.join(timeout=30)
            report_path.unlink(missing_ok=True)
        expected = newest_committed(root)
    elapsed = time.monotonic() - started
    return {
        **counts,
        "seconds_per_trial": elapsed / max(trials, 1),
        "failures": failures[:5],
        "events": event_counts(root),
    }
