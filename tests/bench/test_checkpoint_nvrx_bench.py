"""`nvrx-eks bench checkpoint`'s NVRx rows: NVRx's own checkpointing on the kit's loop, same columns."""

from __future__ import annotations

import json

import pytest
import torch

from nvrx_eks.bench.checkpoint.nvrx_bench import CPU_ONLY_REASONS, run_async_dcp_row


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nvrx_async_dcp_row_on_a_tiny_state_fills_every_column(tmp_path):
    row = run_async_dcp_row(
        root=tmp_path / "nvrx", state_bytes=4 << 20, kind="device", step_s=0.05, every=2, checkpoints=3
    )
    # Every scheduled save was written and finalized by NVRx's worker, and each column is a measurement.
    assert row.persisted == {"local": 3}, row
    assert row.interval_s == pytest.approx(0.1)
    assert row.stall_s > 0, row
    assert 0 < row.efficiency < 1, row
    assert row.first_save_s > 0, row
    assert row.persist_s is not None, row
    assert row.persist_s > 0, row
    assert row.restore_s > 0, row
    assert not (tmp_path / "nvrx").exists(), "the row's checkpoints must not outlive it"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_checkpoint_prints_nvrx_rows_beside_the_kits_and_records_them(nvrx_eks, tmp_path):
    out = tmp_path / "bench.json"
    # fmt: off
    result = nvrx_eks(
        "bench", "checkpoint", "--state-gb", "0.01", "--step-s", "0.05", "--interval", "2",
        "--checkpoints", "2", "--torture-trials", "0", "--json-out", str(out),
        # A folder that does not exist yet: created, never a FileNotFoundError traceback.
        "--workdir", str(tmp_path / "missing" / "deeper"),
        timeout=540,
    )
    # fmt: on
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = result.stdout.split("the kit beside NVRx's own checkpointing")[1]
    assert "kit tiered" in table
    assert "nvrx async DCP" in table
    for name, reason in CPU_ONLY_REASONS.items():
        assert f"{name}" in table
        assert f"not measurable on CPU: {reason}" in table
    document = json.loads(out.read_text())
    (nvrx,) = document["nvrx_rows"]
    assert nvrx["implementation"] == "nvrx async DCP"
    assert nvrx["every"] == 2
    assert {"stall_s", "efficiency", "first_save_s", "restore_s", "persist_s"} <= nvrx.keys()
    assert document["nvrx_not_measurable"] == CPU_ONLY_REASONS
    # The kit's rows keep their columns, and gain the first save beside NVRx's.
    assert all(row["first_save_s"] > 0 for row in document["rows"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU these paths run (bench/gpu_check.py)")
def test_the_rows_printed_not_measurable_fail_on_cpu_where_their_reason_says(tmp_path):
    """Each reason is what NVRx does on this CPU: when NVRx makes a path CPU-capable, this fails and
    the path gets a measured row instead."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt.torch_ckpt import TorchAsyncCheckpoint  # noqa: PLC0415
    from nvidia_resiliency_ext.checkpointing.local.basic_state_dict import (  # noqa: PLC0415
        BasicTensorAwareStateDict,
    )

    state = {"model": {"w": torch.zeros(4)}}
    saver = TorchAsyncCheckpoint()
    with pytest.raises(AssertionError, match="not compiled with CUDA"):
        saver.async_save(state, tmp_path / "torch.pt")
    assert saver._get_async_calls_queue().get_num_unfinalized_calls() == 0
    with pytest.raises(AssertionError):
        BasicTensorAwareStateDict(state)
    assert "torch.cuda.synchronize()" in CPU_ONLY_REASONS["nvrx TorchAsyncCheckpoint"]
    assert "assert state_dict_value.is_cuda" in CPU_ONLY_REASONS["nvrx local + replication"]
