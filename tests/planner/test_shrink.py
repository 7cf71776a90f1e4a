"""`nvrx-eks plan`'s shrink table: training on smaller against waiting for a lost node's replacement, per
replacement delay, for the job of k8s/values/p5-16.yaml."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from nvrx_eks.k8s.values import JobValues
from nvrx_eks.kitcore.configio import UserError, load_model
from nvrx_eks.planner.commands import load_plan
from nvrx_eks.planner.config import Plan
from nvrx_eks.planner.model import evaluate, project, project_all, tier_costs
from nvrx_eks.planner.report import document, print_shrink
from nvrx_eks.planner.shrink import GROW_RETRAINED_STEPS, at_delay, compare, compare_all

REPO = Path(__file__).resolve().parents[2]
P5_16 = REPO / "planner" / "examples" / "p5-16.yaml"
VALUES = REPO / "k8s" / "values" / "p5-16.yaml"
HOUR = 3600.0


def _plan(*overrides: str) -> Plan:
    return load_model(Plan, P5_16, overrides)


def _table(plan: Plan) -> str:
    out = StringIO()
    print_shrink(Console(file=out, width=200), plan, compare_all(plan))
    return out.getvalue()


def _rows(text: str, mode: str) -> dict[str, list[str]]:
    """The rows of `mode` by their delay: [wait, shrink, per loss waiting, per loss shrinking, better]."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells[0] == mode:
            rows[cells[1]] = cells[2:]
    return rows


def test_the_p5_16_plan_is_the_job_of_its_values_file():
    """The plan weighs the job the values run: its size, spares, mode and cadences, and, with the plan's
    min_nodes in the values, the sizes the ranks would shrink to and after how long."""
    plan = _plan()
    assert plan.shrink.min_nodes is not None
    values = load_model(JobValues, VALUES, [f"shrink.min_nodes={plan.shrink.min_nodes}"])
    assert plan.fleet.nodes == values.num_nodes == 16
    assert plan.fleet.instance_profile == values.instance_profile
    assert plan.fleet.spares == values.spares
    checkpoint = values.trainer.checkpoint
    tiers = plan.modes[values.mode].tiers
    assert (tiers["memory"], tiers["local"], tiers["durable"]) == (
        checkpoint.memory_every,
        checkpoint.local_every,
        checkpoint.durable_every,
    )
    ranks_per_node = plan.fleet.profile.workers_per_node
    assert plan.shrink.node_counts(16, ranks_per_node) == values.trainer.shrink.node_counts
    assert plan.shrink.pending_limit_s == values.trainer.shrink.after_s == values.shrink.pending_limit_s
    assert plan.shrink.parallel.mesh == values.trainer.parallel.mesh


def test_the_report_prints_wait_and_shrink_at_10_min_1_h_and_4_h():
    text = _table(_plan())
    assert "16 -> 15 nodes (shrink.min_nodes 8) after 10.0 min pending" in text
    for mode in ("ft_launcher", "both"):
        rows = _rows(text, mode)
        assert list(rows) == ["10.0 min", "1.0 h", "4.0 h"], mode
        assert [row[-1] for row in rows.values()] == ["same", "shrink", "shrink"], mode
        assert rows["10.0 min"][0] == rows["10.0 min"][1], mode  # the replacement came within the limit
        wait_4h, shrink_4h = (float(cell.rstrip("%")) for cell in rows["4.0 h"][:2])
        assert shrink_4h > wait_4h + 0.5, mode
    assert "both: shrinking wins once a replacement takes longer than 38.6 min (break-even)" in text


def test_shrinking_beats_waiting_at_4_h_by_most_of_the_wait():
    """Waiting 4 h idles all 16 nodes 4 h; shrinking idles them for the 10 min limit, pays two rounds, two
    durable restores and lost work, and trains 15/16 as fast for the rest."""
    row = compare(_plan(), "both").rows[2]
    assert row.delay_s == 4 * HOUR
    assert row.shrink.training_goodput > row.wait.training_goodput
    assert row.wait_per_loss_s > 4 * HOUR
    assert row.shrink_per_loss_s < 1.2 * HOUR
    assert row.shrink.badput["shrunk"] > 0
    assert row.wait.badput["shrunk"] == 0


def test_the_shrink_cost_is_the_sum_of_its_parts():
    """One loss without a spare at a 4 h delay, by hand: the pending limit, a round and a durable restore
    each way, half a durable interval plus its write lost at the shrink, the few steps a grow retrains,
    and the stretch (to the replacement, then to the shrunk job's next durable commit) trained 15/16 as
    fast, the global batch kept."""
    plan = _plan()
    row = compare(plan, "both").rows[2]
    delay, limit, round_s = 4 * HOUR, plan.shrink.pending_limit_s, plan.recovery.node_swap_s
    durable = tier_costs(plan, "both", {"memory": 10, "local": 50, "durable": 500})["durable"]
    interval = 500 * plan.workload.step_s
    assert durable.effective_s == interval
    stretch = delay - limit - round_s - durable.restore_s
    expected = (
        limit
        + 2 * round_s
        + 2 * durable.restore_s
        + (interval / 2 + durable.lag_s)
        + GROW_RETRAINED_STEPS * plan.workload.step_s
        + (stretch + interval / 2 / (15 / 16) + durable.lag_s) * (1 - 15 / 16)
    )
    assert row.shrink_per_loss_s == pytest.approx(expected)
    # Waiting: the delay, the round, and the partner's RAM copy (peer replicas).
    assert row.wait.fault_costs["node"].tier == "memory"
    memory = tier_costs(plan, "both", {"memory": 10})["memory"]
    assert row.wait_per_loss_s == pytest.approx(delay + round_s + memory.restore_s + memory.lost_s)


@pytest.mark.parametrize("delay", [60.0, 300.0, 600.0])
def test_within_the_pending_limit_both_wait_alike(delay):
    row = compare(_plan(f"shrink.delays_s=[{delay}]"), "both").rows[0]
    assert row.better == "same"
    assert row.shrink.training_goodput == pytest.approx(row.wait.training_goodput, abs=1e-12)


def test_just_past_the_pending_limit_waiting_wins():
    """A replacement 15 min away: the shrink's durable restores and lost work outweigh 5 min of waiting."""
    row = compare(_plan("shrink.delays_s=[900]"), "both").rows[0]
    assert row.better == "wait"
    assert row.wait.training_goodput > row.shrink.training_goodput


def test_goodput_falls_with_the_delay_and_shrinkings_lead_grows_with_it():
    delays = [300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400]
    rows = compare(_plan(f"shrink.delays_s={delays}"), "both").rows
    wait = [r.wait.training_goodput for r in rows]
    shrink = [r.shrink.training_goodput for r in rows]
    lead = [s - w for s, w in zip(shrink, wait, strict=True)]
    assert wait == sorted(wait, reverse=True)
    assert shrink == sorted(shrink, reverse=True)
    assert lead[2:] == sorted(lead[2:])  # past the pending limit
    assert wait[-1] < wait[0]


def test_the_break_even_delay_is_where_the_costs_meet():
    plan = _plan()
    comparison = compare(plan, "both")
    even = comparison.break_even_s
    assert even is not None
    assert plan.shrink.pending_limit_s < even < HOUR
    before, after = compare(_plan(f"shrink.delays_s=[{even - 30}, {even + 30}]"), "both").rows
    assert before.better == "wait"
    assert after.better == "shrink"


def test_without_memory_copies_shrinking_pays_off_sooner():
    """ft_launcher restores a lost node's work from the durable tier anyway, so shrinking adds less."""
    plan = _plan()
    assert compare(plan, "ft_launcher").break_even_s < compare(plan, "both").break_even_s  # type: ignore[operator]


def test_a_layout_that_shrinks_further_trains_slower_while_shrunk():
    """{dp: 4, fsdp: -1, tp: 8} runs at a multiple of 4 nodes: 12 of 16 after one loss, not 15."""
    plan = _plan("shrink.parallel.mesh={dp: 4, fsdp: -1, tp: 8}")
    twelve, fifteen = compare(plan, "both"), compare(_plan(), "both")
    assert twelve.shrunk_nodes == 12
    assert fifteen.shrunk_nodes == 15
    assert twelve.rows[2].shrink_per_loss_s > fifteen.rows[2].shrink_per_loss_s + 0.15 * 3.5 * HOUR


def test_the_wait_column_is_the_plain_model_at_that_repair_time():
    """Waiting is what the planner already projects when a lost node is back after the delay."""
    plan = _plan()
    cadences = {t: i.every_steps for t, i in project(plan, "both").intervals.items()}
    for row in compare(plan, "both").rows:
        plain = evaluate(at_delay(plan, row.delay_s), "both", cadences)
        assert row.wait.training_goodput == pytest.approx(plain.training_goodput, rel=1e-12)


def test_no_table_without_min_nodes_and_json_with_it():
    off = _plan("shrink.min_nodes=null")
    assert compare_all(off) == []
    plan = _plan()
    doc = document(project_all(plan), sims={}, measured={}, inputs={}, plots=[], shrink=compare_all(plan))
    (both,) = [c for c in doc["shrink"] if c["mode"] == "both"]
    assert [r["delay_s"] for r in both["rows"]] == [600.0, 3600.0, 14400.0]
    assert [r["better"] for r in both["rows"]] == ["same", "shrink", "shrink"]
    assert both["shrunk_nodes"] == 15


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["shrink.min_nodes=16"], "shrink.min_nodes (16) must be below fleet.nodes (16)"),
        (["shrink.min_nodes=0"], "shrink.min_nodes: Input should be greater than or equal to 1"),
        (["shrink.delays_s=[600, 0]"], "shrink.delays_s.1: Input should be greater than 0"),
        (["shrink.delays_s=[]"], "shrink.delays_s: List should have at least 1 item"),
        (["shrink.pending_limit_s=-5"], "shrink.pending_limit_s: Input should be greater than 0"),
        (
            ["shrink.parallel.mesh={dp: 4, fsdp: -1, tp: 8}", "shrink.min_nodes=13"],
            "shrink.min_nodes (13): shrink.parallel.mesh {dp: 4, fsdp: -1, tp: 8} cannot run on 13",
        ),
    ],
)
def test_bad_shrink_input_names_the_field(overrides, message):
    with pytest.raises(UserError) as error:
        load_plan(P5_16, overrides, None)
    assert message in str(error.value)


def test_shrinking_needs_a_mode_that_restarts_at_another_size(tmp_path):
    plan = tmp_path / "baseline.yaml"
    text = P5_16.read_text()
    plan.write_text(text[: text.index("modes:")] + "modes:\n  baseline: {tiers: {durable: 500}}\n")
    with pytest.raises(UserError, match=r"none of the plan's modes \(baseline\) runs ft_launcher"):
        load_plan(plan, ["shrink.min_nodes=8"], None)
    assert compare_all(load_plan(plan, [], None)[0]) == []


def test_bad_shrink_input_exits_2_with_one_message(nvrx_eks):
    result = nvrx_eks(
        "plan", str(P5_16), "--set", "shrink.min_nodes=20", "--no-plots", "--no-simulate", timeout=120
    )
    assert result.returncode == 2
    assert "shrink.min_nodes (20) must be below fleet.nodes (16)" in result.stderr
    assert "Traceback" not in result.stderr
