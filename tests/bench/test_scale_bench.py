"""`nvrx-eks bench scale`: the rows built from a run's fault summaries, the per-size job values, and
(slow) the command end to end at 2 nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvrx_eks.bench.scale import (
    MEMORY_EVERY,
    fault_plan,
    goals,
    overrides,
    parse_nodes,
    scale_rows,
)
from nvrx_eks.k8s.load import load_values
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.localrun.summary import FaultPhases, FaultSummary
from nvrx_eks.training.config import parse_args
from nvrx_eks.training.faults import build_schedule

VALUES = Path(__file__).resolve().parents[2] / "k8s" / "values" / "local-cpu.yaml"
PHASES = FaultPhases(
    detect_s=0.5, teardown_s=1.0, rendezvous_s=2.0, start_s=3.0, restore_s=0.25, first_step_s=0.25
)


def _fault(cls: str, *, layer: str, expected: str, recovery_s: float | None = 7.0) -> FaultSummary:
    return FaultSummary(
        cls=cls,
        step=10,
        rank=0,
        expected_layer=expected,
        layer=layer,
        detect_s=0.5,
        recovery_s=recovery_s,
        steps_lost=1,
        tier="peer_memory",
        phases=PHASES,
    )


def test_a_row_per_planned_class_says_whether_its_layer_recovered_it():
    faults = [
        _fault("exception", layer="inprocess", expected="inprocess"),
        # Recovered, but by the launcher where the in-process layer should have: not "recovered".
        _fault("sigkill", layer="job_controller", expected="ft_launcher"),
    ]
    rows = scale_rows(4, faults, memory_every=MEMORY_EVERY)
    assert [r["class"] for r in rows] == ["exception", "sigkill", "node_loss", "store_loss"]
    exception, sigkill, node_loss, _ = rows
    assert exception["nodes"] == 4
    assert exception["recovered"] is True
    assert exception["recovery_s"] == 7.0
    assert exception["steps_lost"] == 1
    assert exception["memory_every"] == MEMORY_EVERY
    assert exception["phases"]["rendezvous_s"] == 2.0
    assert exception["phases"]["total_s"] == pytest.approx(7.0)
    assert sigkill["recovered"] is False
    # The run never measured a node loss (the job died first): a row that did not recover.
    assert node_loss["recovered"] is False
    assert node_loss["recovery_s"] is None
    assert node_loss["phases"] is None


def test_a_fault_that_never_came_back_is_not_recovered():
    (row, *_) = scale_rows(
        2, [_fault("exception", layer="inprocess", expected="inprocess", recovery_s=None)], memory_every=2
    )
    assert row["recovered"] is False


def test_goals_compare_the_largest_size_with_the_smallest():
    rows = [
        *scale_rows(
            2,
            [_fault(c, layer="x", expected="x", recovery_s=4.0) for c in ("sigkill", "node_loss")],
            memory_every=2,
        ),
        *scale_rows(
            8,
            [
                _fault("sigkill", layer="x", expected="x", recovery_s=10.0),
                _fault("node_loss", layer="x", expected="x", recovery_s=6.0),
            ],
            memory_every=2,
        ),
    ]
    result = goals(rows)
    assert (result["smallest"], result["largest"]) == (2, 8)
    assert result["node_loss_s"] == 6.0
    assert result["node_loss_met"] is True
    assert result["node_loss_growth"] == pytest.approx(1.5)
    assert result["sigkill_growth"] == pytest.approx(2.5)
    assert result["sigkill_growth_met"] is False


def test_each_size_is_the_local_job_with_one_rank_per_node_and_the_node_loss_on_the_last():
    assert fault_plan(8) == "exception@10:0,sigkill@20:1,node_loss@30:7,store_loss@41:0"
    values = load_values(VALUES, overrides(nodes=8, steps=50, device_step_s=0.5))
    assert values.num_nodes == 8
    assert values.profile.workers_per_node == 1
    assert values.world_size == 8
    config = values.trainer
    assert parse_args(values.entrypoint.args).steps == 50  # the reference trainer's own argument
    schedule = build_schedule(config.faults, steps=50, world_size=values.world_size, seed=0)
    assert [(f.cls, f.step, f.rank) for f in schedule] == [
        ("exception", 10, 0),
        ("sigkill", 20, 1),
        ("node_loss", 30, 7),
        ("store_loss", 41, 0),
    ]
    assert config.checkpoint.memory_every == MEMORY_EVERY


@pytest.mark.parametrize("text", ["1", "2,x", "", "0,4"])
def test_a_node_count_below_two_is_one_message(text):
    with pytest.raises(UserError, match="--nodes"):
        parse_nodes(text)


def test_nodes_are_parsed_sorted_and_once():
    assert parse_nodes("8, 2,4,2") == [2, 4, 8]


def test_too_few_steps_for_the_plan_is_one_message():
    with pytest.raises(UserError, match="--steps 41"):
        overrides(nodes=2, steps=41, device_step_s=0.0)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_scale_at_two_nodes_writes_rows_and_png_and_each_class_recovers(tmp_path, nvrx_eks):
    out = tmp_path / "scale.json"
    result = nvrx_eks(
        *("bench", "scale", "--nodes", "2", "--device-step-s", "0.25"),
        *("--runs", str(tmp_path / "runs"), "--json-out", str(out)),
        timeout=115,
        piped=True,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    document = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    rows = document["rows"]
    assert [(r["nodes"], r["class"]) for r in rows] == [
        (2, "exception"),
        (2, "sigkill"),
        (2, "node_loss"),
        (2, "store_loss"),
    ]
    layers = {r["class"]: r["layer"] for r in rows}
    assert layers == {
        "exception": "inprocess",
        "sigkill": "ft_launcher",
        "node_loss": "job_controller",
        "store_loss": "job_controller",
    }
    local_every = load_values(VALUES).trainer.checkpoint.local_every
    for row in rows:
        assert row["recovered"], row
        # The phases run on to the next productive step: past the last rank's restart.
        assert row["phases"]["total_s"] >= row["recovery_s"] > 0, row
        if row["class"] == "store_loss":
            # Every pod restarts (the RAM tier goes with them): back from the node-local disk.
            assert row["steps_lost"] <= local_every, row
        else:
            # A hard fault comes back from a RAM snapshot: at most two intervals of steps lost.
            assert row["steps_lost"] <= 2 * MEMORY_EVERY, row
    assert document["runs"][0]["completed"], document["runs"]
    assert document["versions"]["torch"]
    assert "recovered" in result.stdout


@pytest.mark.parametrize("args", [("--nodes", "1,4"), ("--steps", "20")], ids=["one-node", "few-steps"])
def test_bad_input_to_the_command_is_one_message_and_exit_2(tmp_path, nvrx_eks, args):
    result = nvrx_eks("bench", "scale", *args, "--runs", str(tmp_path), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {args[0]} "), result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())  # nothing ran
