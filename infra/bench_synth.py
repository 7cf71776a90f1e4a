"""Benchmark: synthesis time of the whole CDK app (construct tree + cdk-nag + templates).

Prints each synth's seconds and ratios measured side by side in one process: warm synth / first
synth (the jsii runtime's start-up share) and each config / the first config (the cost of its size).
"""

from __future__ import annotations

import tempfile
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path


def synth_seconds(config_path: Path) -> tuple[float, int]:
    """Seconds for one in-process synth of `config_path`, and the stack's resource count."""
    from aws_cdk import App  # noqa: PLC0415

    from nvrx_eks.infra.app import PLACEHOLDER_ACCOUNT, build, load_config  # noqa: PLC0415

    config = load_config(config_path)
    with tempfile.TemporaryDirectory(prefix="nvrx-eks-bench-") as outdir:
        started = time.perf_counter()
        app = App(outdir=outdir)
        stack = build(app, config, account=PLACEHOLDER_ACCOUNT)
        template = app.synth().get_stack_by_name(stack.stack_name).template
        seconds = time.perf_counter() - started
    return seconds, len(template["Resources"])


def run(configs: Sequence[Path], *, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    started = time.perf_counter()
    for path in configs:
        for _ in range(repeats):
            seconds, resources = synth_seconds(path)
            times.setdefault(str(path), []).append(seconds)
            print(f"synth {path}: {seconds:6.2f} s ({resources} resources)")
    first = next(iter(times.values()))
    print(f"total {time.perf_counter() - started:.1f} s for {sum(map(len, times.values()))} synths")
    if len(first) > 1:
        print(f"warm/first synth ratio ({next(iter(times))}): {min(first[1:]) / first[0]:.2f}")
    base = min(first[1:] or first)
    for name, values in times.items():
        print(f"{name}: best {min(values):.2f} s, {min(values) / base:.2f}x the first config's best")
    return times
