"""The demo's numerics verdict when a chaos run's weights are not bit-identical to its fault-free run's:
the measured difference, and whether the parallelism explains it (never a silent mismatch or pass)."""

from __future__ import annotations

import torch

from nvrx_eks.localrun.numerics import compare, verdict


def _save(path, **tensors):
    torch.save(tensors, path)
    return path


def test_the_difference_is_measured_tensor_by_tensor(tmp_path):
    reference = _save(tmp_path / "ref.pt", w=torch.ones(4), b=torch.zeros(2))
    chaos = _save(tmp_path / "chaos.pt", w=torch.tensor([1.0, 1.0, 1.0 + 2**-20, 1.0]), b=torch.zeros(2))
    difference = compare(chaos, reference)
    assert difference is not None
    assert (difference["differing"], difference["tensors"]) == (1, 2)
    assert difference["max_abs_diff"] == 2**-20
    assert 0 < difference["relative_l2"] < 1e-6
    assert compare(chaos, tmp_path / "missing.pt") is None


def test_a_reordered_reduction_explains_a_difference_and_nothing_else_does(tmp_path):
    reference = _save(tmp_path / "ref.pt", w=torch.ones(4))
    chaos = _save(tmp_path / "chaos.pt", w=torch.full((4,), 1.0 + 2**-20))
    difference = compare(chaos, reference)
    differs = {"bit_identical": False}
    ddp = verdict(differs, difference, {"replicated"})
    assert "rebuilds its gradient buckets" in ddp["explained"]
    assert ddp["difference"] == difference
    # FSDP2 / tensor parallelism and the kit's own average are exact across restarts: a difference
    # there is unexplained, and so is one nobody could measure.
    assert verdict(differs, difference, {"sharded"})["explained"] == ""
    assert verdict(differs, difference, {"kit"})["explained"] == ""
    assert verdict(differs, None, {"replicated"})["explained"] == ""
    exact = verdict({"bit_identical": True}, None, {"replicated"})
    assert exact == {"bit_identical": True, "parallelism": ["replicated"], "explained": ""}
    # Different keys or shapes are no rounding: unexplained whatever the parallelism.
    other = compare(_save(tmp_path / "other.pt", v=torch.ones(4)), reference)
    assert verdict(differs, other, {"replicated"})["explained"] == ""
