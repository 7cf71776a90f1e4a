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
their own. Step times are medians of many steps; a single run's absolute times are this machine's
and not comparable across machines (docs/measurements.md keeps the dated figures).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

DEFAULT_STEPS = 200
DEFAULT_BLOCKS = 3


def _plain(model_name: str, steps: int, seed: int) -> list[float]:
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: N812, PLC0415

    from training.data import DataSource, SyntheticTokens  # noqa: PLC0415
    from training.model import PRESETS, build_model  # noqa: PLC0415

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

    from training import api  # noqa: PLC0415
    from training.data import DataSource, SyntheticTokens  # noqa: PLC0415
    from training.model import PRESETS, build_model  # noqa: PLC0415

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

    from training import api  # noqa: PLC0415

    tensor = torch.ones(1)
    number = 2000
    return {
        "rng capture": timeit.timeit(api._rng_state, number=number) / number * 1e6,  # noqa: SLF001
        "loss to float": timeit.timeit(lambda: float(tensor.detach()), number=number) / number * 1e6,
    }


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
