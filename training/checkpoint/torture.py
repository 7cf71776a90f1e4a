"""kill -9 torture: a rank is killed at random points while it persists; every resume must come from
the newest checkpoint committed in any tier at the moment of the kill, with exactly its contents.

Each trial starts a child rank that first resumes (reporting the step, tier and whether the state
matches what that step saved), then keeps saving with all tiers on until the parent SIGKILLs its
whole process group at a random moment. The parent computes the expected resume step itself, by
reading the committed manifests left behind, before starting the next child.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from training.checkpoint.config import CheckpointConfig

STATE_ELEMENTS = 1 << 18  # 1 MiB of float32 per tensor: big enough that writes take a while


def expected_state(step: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(STATE_ELEMENTS, generator=generator), "b": torch.full((7,), float(step))},
        "data": {"step": step},
    }


def _config(root: Path) -> CheckpointConfig:
    from training.checkpoint.config import CheckpointConfig  # noqa: PLC0415

    return CheckpointConfig(
        memory_dir=root / "shm",
        memory_every=1,
        local_dir=root / "local",
        local_every=1,
        durable_dir=str(root / "durable"),
        durable_every=2,
        keep=2,
        persist_timeout_s=60,
    )


def newest_committed(root: Path) -> int | None:
    """The newest step with a committed manifest in any tier (read from the files, not the loader)."""
    steps: list[int] = []
    for manifest in (root / "shm").glob("rank-*/slot-*.json"):
        try:
            steps.append(json.loads(manifest.read_text())["step"])
        except (OSError, ValueError, KeyError):
            continue
    for tier in ("local", "durable"):
        for manifest in (root / tier).glob("step-*/rank-*.json"):
            try:
                steps.append(json.loads(manifest.read_text())["step"])
            except (OSError, ValueError, KeyError):
                continue
    return max(steps, default=None)


def child(root: Path, delay_s: float) -> None:
    from training.checkpoint.factory import disk_stores  # noqa: PLC0415
    from training.checkpoint.stats import make_emitter  # noqa: PLC0415
    from training.checkpoint.tiered import TieredCheckpointer  # noqa: PLC0415

    config = _config(root)
    ckpt = TieredCheckpointer(
        config=config,
        stores=disk_stores(config),
        rank=0,
        world_size=1,
        node_index=0,
        device=torch.device("cpu"),
        emit=make_emitter(None),
        persist_delay_s=delay_s,
    )
    deadline = time.monotonic() + 120
    while not all(worker.warm() for worker in ckpt.workers.values()) and time.monotonic() < deadline:
        time.sleep(0.05)  # kill during persists, not during the writer's start
    restored = ckpt.load_latest()
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
    print(json.dumps(report), flush=True)
    step = (restored.step if restored else 0) + 1
    while True:
        ckpt.save(step, expected_state(step))
        step += 1
        time.sleep(0.02)


def run_trials(*, root: Path, trials: int, seed: int = 0, max_kill_s: float = 3.0) -> dict[str, Any]:
    """Run `trials` kill -9 trials; returns counts (ok, wrong step, inexact state, no resume)."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible kill schedule, not security
    counts = {"trials": 0, "ok": 0, "wrong_step": 0, "inexact": 0, "failed_start": 0}
    failures: list[dict[str, Any]] = []
    expected: int | None = None
    for trial in range(trials + 1):  # the last child only reports the final resume
        delay = rng.choice([0.0, 0.01, 0.05])
        proc = subprocess.Popen(
            [sys.executable, "-m", "training.checkpoint.torture", "--child", str(root), str(delay)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: the kill takes its writer workers too
            text=True,
        )
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            if trial:
                counts["trials"] += 1
                try:
                    report = json.loads(line)
                except ValueError:
                    counts["failed_start"] += 1
                    failures.append({"trial": trial, "output": line})
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
            time.sleep(rng.uniform(0.2, max_kill_s))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            if proc.stdout:
                proc.stdout.close()
        expected = newest_committed(root)
    return {**counts, "failures": failures[:5]}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(Path(sys.argv[2]), float(sys.argv[3]))
