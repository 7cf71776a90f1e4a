"""`nvrx-eks bench api`: what the public API (training/api.py) costs per step, against the same loop in
plain PyTorch.

One process, one CPU rank, the reference trainer's model preset, data and AdamW. Two loops train the
same steps, interleaved in blocks so the machine's drift hits both alike:

- `plain`: the loop a script has without the kit: zero_grad, forward, backward, clip, optimizer step.
- `api`: the same body through `Job().run` / `Attempt.steps` / `Attempt.update` in mode `baseline`,
  checkpoints off: what remains is the API's own per-step work (the step boundary's RNG capture, the
  atomic update, the step event and metrics, the heartbeat hooks) and nothing that a checkpoint cadence
  or a layer would add on top.

It prints each loop's median step time, their ratio, and the parts of the API's per-step work timed on
their own.

Device-bound emulation (`loss_sync`): what reading the loss every step costs when a device computes.
A worker thread stands in for a GPU stream: each step the host spends `host_s` preparing it and queues
`device_s` of device work, whose loss is a `torch.futures.Future` completed when that work ends. Two
loops through the API: one reads the loss on the host every step (`float(loss)`: what the kit did in
`update()`, a device sync per step), one hands it to `update(loss=...)`, which reads it once landed.
Synced, a step costs host + device; not synced, the host prepares the next step while the device
computes, and a step costs max(host, device).

Step times are medians of many steps; a single run's absolute times are this machine's and not
comparable across machines (docs/measurements.md keeps the dated figures).

`--against REV`: the reference trainer (`python -m nvrx_eks.training`, one rank, its default checkpoint
cadences) at REV and in this checkout, interleaved runs, each step's full cost as the interval between
consecutive `step` events (the loop's work between them: the step, the checkpointer's decision and
copy, the events, the metrics, the layers' hooks). That is the question a change to the API must
answer: does the reference loop, the API's first client, pay more per step than before.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

from nvrx_eks.training.resilience.config import CONFIG_ENV

DEFAULT_STEPS = 200
DEFAULT_BLOCKS = 3
RUN_DIR = "runs/train"
"""`ResilienceConfig.run_dir`'s default: where `--against` finds each revision's events."""


def _plain(model_name: str, steps: int, seed: int) -> list[float]:
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: N812, PLC0415

    from nvrx_eks.training.data import DataSource, SyntheticTokens  # noqa: PLC0415
    from nvrx_eks.training.model import PRESETS, build_model  # noqa: PLC0415

    shape = PRESETS[model_name]
    model = build_model(model_name, seed=seed, device=torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
    source = SyntheticTokens(seed=seed, vocab_size=shape.vocab_size, seq_len=shape.seq_len)
    data = DataSource(source=source, batch_size=4, world_size=1)
    times = []
    for step in range(steps):
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        batch = data.batch(step, 0, torch.device("cpu"))
        loss = F.cross_entropy(model(batch.inputs).flatten(0, 1).float(), batch.targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        float(loss.detach())
        times.append(time.perf_counter() - started)
    return times


def _through_the_api(model_name: str, steps: int, seed: int, run_dir: Path) -> list[float]:
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: N812, PLC0415

    from nvrx_eks.training import api  # noqa: PLC0415
    from nvrx_eks.training.data import DataSource, SyntheticTokens  # noqa: PLC0415
    from nvrx_eks.training.model import PRESETS, build_model  # noqa: PLC0415

    shape = PRESETS[model_name]
    times: list[float] = []

    def train(attempt: api.Attempt) -> None:
        model = build_model(model_name, seed=seed, device=attempt.device)
        wrapped = attempt.data_parallel(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
        attempt.resume(model=model, optimizer=optimizer)
        source = SyntheticTokens(seed=seed, vocab_size=shape.vocab_size, seq_len=shape.seq_len)
        data = DataSource(source=source, batch_size=4, world_size=1)
        started = time.perf_counter()
        for step in attempt.steps(steps):
            batch = data.batch(step, 0, attempt.device)
            loss = F.cross_entropy(wrapped(batch.inputs).flatten(0, 1).float(), batch.targets.flatten())
            loss.backward()
            with attempt.update(loss=loss, clip_grad_norm=1.0):
                optimizer.step()
            now = time.perf_counter()
            times.append(now - started)
            started = now

    config = api.ResilienceConfig.model_validate(
        {"mode": "baseline", "run_dir": run_dir, "checkpoint": {"implementation": "sync", "durable_every": 0}}
    )
    api.Job(config).run(train)
    # The first interval ends at the first step's end: it holds no boundary work before the first step.
    return times


def _parts() -> dict[str, float]:
    """Microseconds per call of the API's per-step work, each timed alone."""
    import torch  # noqa: PLC0415

    from nvrx_eks.training.tracked import rng_state  # noqa: PLC0415

    tensor = torch.ones(1)
    number = 2000
    return {
        "rng capture": timeit.timeit(rng_state, number=number) / number * 1e6,
        "loss read": timeit.timeit(lambda: _read_loss(tensor), number=number) / number * 1e6,
    }


def _device_bound(*, steps: int, host_s: float, device_s: float, sync: bool, run_dir: Path) -> list[float]:
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from nvrx_eks.training import api  # noqa: PLC0415

    times: list[float] = []
    stream = ThreadPoolExecutor(max_workers=1, thread_name_prefix="emulated-device")

    def launch(step: int) -> torch.futures.Future[torch.Tensor]:
        """Queue one step's device work; its loss lands when the work ends."""
        loss: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done = stream.submit(time.sleep, device_s)
        done.add_done_callback(lambda _: loss.set_result(torch.tensor(1.0 / (step + 1))))
        return loss

    def train(attempt: api.Attempt) -> None:
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        attempt.resume(model=model, optimizer=optimizer)
        started = time.perf_counter()
        for step in attempt.steps(steps):
            deadline = time.perf_counter() + host_s
            while time.perf_counter() < deadline:  # the host's own work for the step: a core busy
                pass
            loss = launch(step)
            if sync:
                float(loss.wait())  # the host waits for the device's result
            with attempt.update(loss=loss):
                optimizer.step()
            now = time.perf_counter()
            times.append(now - started)
            started = now
        stream.submit(lambda: None).result()  # the queue drained: the last steps' device time counted
        times.append(time.perf_counter() - started)

    config = api.ResilienceConfig.model_validate(
        {"mode": "baseline", "run_dir": run_dir, "checkpoint": {"implementation": "sync", "durable_every": 0}}
    )
    try:
        api.Job(config).run(train)
    finally:
        stream.shutdown()
    return times


def bench_loss_sync(*, steps: int = 100, host_s: float = 0.005, device_s: float = 0.010) -> dict[str, Any]:
    """The device-bound emulation (module docstring): seconds per step with a host sync per step for the
    loss and without, and their ratio."""
    with tempfile.TemporaryDirectory(prefix="nvrx-eks-bench-api-") as tmp:
        arms = {
            label: sum(
                _device_bound(
                    steps=steps, host_s=host_s, device_s=device_s, sync=sync, run_dir=Path(tmp) / label
                )
            )
            / steps
            for label, sync in (("synced", True), ("kit", False))
        }
    return {
        "host_ms": host_s * 1e3,
        "device_ms": device_s * 1e3,
        "synced_step_ms": arms["synced"] * 1e3,
        "kit_step_ms": arms["kit"] * 1e3,
        "synced_over_kit": arms["synced"] / arms["kit"],
    }


def _read_loss(tensor: Any) -> None:  # noqa: ANN401
    from nvrx_eks.training.attempt import LossReader  # noqa: PLC0415

    reader = LossReader()
    reader.put(0, tensor)
    reader.poll()


def bench_api(
    *, model_name: str = "tiny", steps: int = DEFAULT_STEPS, blocks: int = DEFAULT_BLOCKS
) -> dict[str, Any]:
    """Run `blocks` x (plain, api) loops of `steps` each; return the medians, the ratio and the parts."""
    plain: list[float] = []
    through: list[float] = []
    with tempfile.TemporaryDirectory(prefix="nvrx-eks-bench-api-") as tmp:
        for block in range(blocks):
            # Skip each loop's first steps: allocator and autograd warm-up, the same in both.
            plain += _plain(model_name, steps, seed=block)[5:]
            through += _through_the_api(model_name, steps, seed=block, run_dir=Path(tmp) / f"run-{block}")[5:]
    plain_ms, api_ms = statistics.median(plain) * 1e3, statistics.median(through) * 1e3
    return {
        "model": model_name,
        "steps_per_loop": steps,
        "blocks": blocks,
        "plain_median_ms": plain_ms,
        "api_median_ms": api_ms,
        "api_over_plain": api_ms / plain_ms,
        "api_cost_ms": api_ms - plain_ms,
        "parts_us": _parts(),
        "loss_sync": bench_loss_sync(),
    }


def print_bench(result: dict[str, Any]) -> None:
    print(
        f"model {result['model']}, {result['blocks']} blocks x {result['steps_per_loop']} steps per loop, "
        "one CPU rank, checkpoints off"
    )
    print(f"  plain PyTorch loop   median step {result['plain_median_ms']:.2f} ms")
    print(f"  through training.api median step {result['api_median_ms']:.2f} ms")
    print(
        f"  api / plain          {result['api_over_plain']:.4f} "
        f"({(result['api_over_plain'] - 1) * 100:+.2f}%, {result['api_cost_ms'] * 1e3:+.0f} us per step)"
    )
    for name, micros in result["parts_us"].items():
        print(f"  part: {name:16} {micros:.1f} us per call")
    sync = result["loss_sync"]
    print(
        f"device-bound emulation (host {sync['host_ms']:.0f} ms + device {sync['device_ms']:.0f} ms a step): "
        f"the loss read every step {sync['synced_step_ms']:.2f} ms per step, handed to update() "
        f"{sync['kit_step_ms']:.2f} ms ({sync['synced_over_kit']:.2f}x)"
    )


def _reference_intervals(source: Path, run_dir: Path, steps: int) -> list[float]:
    """Seconds between consecutive steps of `python -m nvrx_eks.training` run from the tree at `source`.

    The trainer runs in `run_dir` with the kit's default run folder, runs/train, named in
    NVRX_EKS_CONFIG: a revision that took the kit's settings as flags writes to the same default."""
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "MASTER_PORT"}}
    env |= {"PYTHONPATH": str(source), "OMP_NUM_THREADS": "1", CONFIG_ENV: json.dumps({"run_dir": RUN_DIR})}
    run_dir.mkdir(parents=True)
    subprocess.run(
        [sys.executable, "-m", "nvrx_eks.training", "--steps", str(steps), "--log-every", str(steps)],
        cwd=run_dir,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    events_file = run_dir / RUN_DIR / "events" / "rank-0.jsonl"
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    times = [e["t"] for e in events if e["kind"] == "step"]
    return [later - earlier for earlier, later in itertools.pairwise(times[10:])]


def bench_against(rev: str, *, steps: int = 300, repeats: int = 3) -> dict[str, Any]:
    """The reference loop's median step interval at `rev` and in this checkout, `repeats` runs each."""
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="nvrx-eks-bench-api-") as tmp:
        old = Path(tmp) / "old"
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", str(old), rev],
            check=True,
            capture_output=True,
        )
        try:
            medians: dict[str, list[float]] = {"before": [], "now": []}
            for repeat in range(repeats):
                for label, source in (("before", old), ("now", repo)):
                    run_dir = Path(tmp) / f"{label}-{repeat}"
                    medians[label].append(statistics.median(_reference_intervals(source, run_dir, steps)))
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(old)], check=False)
    before, now = statistics.median(medians["before"]), statistics.median(medians["now"])
    return {
        "rev": rev,
        "steps": steps,
        "repeats": repeats,
        "medians_s": medians,
        "now_over_before": now / before,
    }


def print_against(result: dict[str, Any]) -> None:
    print(
        f"reference trainer, one CPU rank, {result['steps']} steps, {result['repeats']} interleaved runs "
        "each; median interval between steps"
    )
    for label in ("before", "now"):
        runs = ", ".join(f"{m * 1e3:.2f}" for m in result["medians_s"][label])
        name = f"at {result['rev']}" if label == "before" else "this checkout"
        print(f"  {name:16} {runs} ms")
    print(
        f"  now / before     {result['now_over_before']:.4f} ({(result['now_over_before'] - 1) * 100:+.2f}%)"
    )
