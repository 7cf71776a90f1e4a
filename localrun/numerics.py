"""How far a chaos run's final parameters are from its fault-free run's, when they are not bit-identical.

The demo's verdict is bit-identity wherever the parallelism allows it. Where it cannot, the verdict
says which parallelism, why, and by how much (never a silent mismatch, never a silent pass): a
script's own DistributedDataParallel rebuilds its gradient buckets after its first step, and a
restarted attempt's first step sums each gradient element in another order (gloo and NCCL reduce in
an order that depends on the element's place in its bucket), so the last bits differ from then on.
The kit's own data parallelism (`attempt.data_parallel` on CPU) averages in a fixed layout, and DTensor
state (FSDP2, tensor parallelism) reduces the same way every attempt: both stay exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

REORDERED = {
    "replicated": (
        "the script's own data parallelism (DistributedDataParallel) rebuilds its gradient buckets after "
        "its first step; a restarted attempt's first step sums each gradient in another order, so the "
        "last bits differ from then on"
    ),
}
"""Parallelisms (the ranks' `startup_done` `parallelism`) whose restarts change the reduction order."""


def compare(chaos: Path | None, reference: Path | None) -> dict[str, Any] | None:
    """{max_abs_diff, relative_l2, tensors, differing}: the chaos run's final parameters against the
    fault-free run's (both `training.attempt.FINAL_STATE`); None when either was not kept."""
    if chaos is None or reference is None or not chaos.is_file() or not reference.is_file():
        return None
    import torch  # noqa: PLC0415

    got, want = (torch.load(path, weights_only=True) for path in (chaos, reference))
    if set(got) != set(want):
        return {
            "max_abs_diff": float("inf"),
            "relative_l2": float("inf"),
            "tensors": len(want),
            "differing": -1,
        }
    worst, diff_sq, norm_sq, differing = 0.0, 0.0, 0.0, 0
    for key, expected in want.items():
        actual = got[key]
        if actual.shape != expected.shape:
            return {
                "max_abs_diff": float("inf"),
                "relative_l2": float("inf"),
                "tensors": len(want),
                "differing": -1,
            }
        delta = actual.double() - expected.double()
        if bool(delta.abs().max() > 0) if delta.numel() else False:
            differing += 1
            worst = max(worst, float(delta.abs().max()))
        diff_sq += float(delta.pow(2).sum())
        norm_sq += float(expected.double().pow(2).sum())
    return {
        "max_abs_diff": worst,
        "relative_l2": (diff_sq**0.5) / (norm_sq**0.5) if norm_sq else 0.0,
        "tensors": len(want),
        "differing": differing,
    }


def verdict(
    document: dict[str, Any], difference: dict[str, Any] | None, parallelism: set[str]
) -> dict[str, Any]:
    """The numerics verdict summary.json carries: bit-identical, or the measured difference and whether
    the parallelism explains it (`explained`: the reason, or "" when nothing does)."""
    if document["bit_identical"]:
        return {"bit_identical": True, "parallelism": sorted(parallelism), "explained": ""}
    reasons = [REORDERED[kind] for kind in sorted(parallelism) if kind in REORDERED]
    finite = difference is not None and difference["differing"] >= 0
    return {
        "bit_identical": False,
        "difference": difference,
        "parallelism": sorted(parallelism),
        "explained": "; ".join(reasons) if reasons and finite else "",
    }
