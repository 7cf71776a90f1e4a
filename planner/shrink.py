"""Shrink instead of waiting: expected goodput when a lost node's replacement is late, both ways.

The job values' `shrink:` (k8s/sections.py Shrink) lets the survivors of a node loss train on at a
smaller size when no spare is free and the replacement stays Pending. Whether that pays depends on how
long the replacement takes to arrive (the delay D: minutes when capacity exists, hours when AWS must
replace the hardware of a Capacity Block), so the plan weighs both at each delay of `shrink.delays_s`.

One node loss that finds no spare, n nodes at full size, n_s the largest size >= min_nodes the parallel
layout runs at with n - 1 present, L the pending limit, r the restart round of a node loss
(`recovery.node_swap_s`), the durable tier's restore R_d and lost work l_d (half its effective interval
plus the write in flight, model.TierCosts.lost_s):
- wait: every node idles D, then the replacement joins as a spare would: r + the restore and lost work
  of the loss's usual tier (memory from partners with peer replicas, else durable).
- shrink (D > L; at D <= L the replacement arrives first and it is the wait): every node idles L, then
  a round at n_s: r + R_d + l_d (a checkpoint resharded to another world comes from the durable tier);
  the job trains for T = D - L - r - R_d at n_s / n of full throughput, as the global batch is kept (each
  step takes n / n_s times longer), which costs T (1 - n_s / n) of the run; when the replacement is
  ready, the shrunk job trains on to its next durable commit (half a durable interval at n_s / n of the
  speed plus the write, on average: training/resilience/launcher_liveness.py GrowBack), then another
  round at full size: r + R_d + the few steps between that commit and the restart
  (`GROW_RETRAINED_STEPS`, as `nvrx-eks local shrink` measures them).
With s spares a loss finds none with the probability of model.size_spares and waits for the first of
the s + 1 nodes out to come back, D / (s + 1); the delay stands for the repair time there. A node loss's
cost is the mixture of the two, and model.evaluate turns it into goodput as for any fault, so the
columns differ only in what a loss without a spare costs: shrink wins exactly when its cost per such
loss is the smaller, and the break-even delay is where the two costs meet.

Not modelled (said so a reader knows): a second loss while shrunk (the rate is per node-day; it is
second order); the checkpoint stall at the shrunk size (each snapshot is n / n_s larger and each step n /
n_s longer, so its share of the loop holds); the simulation (planner/simulate.py) plays waiting only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from nvrx_eks.planner.model import evaluate, fault_costs, project, tier_costs
from nvrx_eks.training.resilience.modes import layers

if TYPE_CHECKING:
    from collections.abc import Mapping

    from nvrx_eks.planner.config import Plan, TierName
    from nvrx_eks.planner.model import FaultCost, ModeResult, NodeLossPolicy, Spares, TierCosts
    from nvrx_eks.training.resilience.modes import Mode

Strategy = Literal["wait", "shrink"]
STRATEGIES: tuple[Strategy, ...] = ("wait", "shrink")
# The longest delay the break-even search looks at: past a month no job waits for a node.
MAX_DELAY_S = 30 * 86400.0
# Costs this close (seconds per loss) are the same outcome: at a delay within the pending limit both
# strategies wait, and only float noise separates them.
TIE_S = 1e-6


@dataclass(frozen=True)
class LossCost:
    """One node loss that finds no spare, in seconds of the whole job."""

    idle_s: float
    """Every node waiting: for the replacement (wait), or for the pending limit (shrink)."""
    recovery_s: float
    restore_s: float
    lost_s: float
    shrunk_s: float

    @property
    def total_s(self) -> float:
        return self.idle_s + self.recovery_s + self.restore_s + self.lost_s + self.shrunk_s


def shrunk_nodes(plan: Plan) -> int:
    """The size the survivors of one loss restart at: the largest the layout runs at with n - 1 present."""
    counts = plan.shrink.node_counts(plan.fleet.nodes, plan.fleet.profile.workers_per_node)
    assert counts  # noqa: S101 - validated by Plan
    return counts[0]


GROW_RETRAINED_STEPS = 6
"""Steps a grow retrains: those the shrunk job trained between the durable commit the grown job restores
and the restart (3-6 in `nvrx-eks local shrink`'s runs: docs/measurements.md)."""


def loss_cost(
    plan: Plan, costs: Mapping[TierName, TierCosts], usual: FaultCost, *, delay_s: float, strategy: Strategy
) -> LossCost:
    """What one node loss without a spare costs when the first node back arrives `delay_s` after it."""
    wait = LossCost(delay_s, usual.recovery_s, usual.restore_s, usual.lost_s, 0.0)
    limit = plan.shrink.pending_limit_s
    if strategy == "wait" or delay_s <= limit:
        return wait
    durable = costs["durable"]
    round_s = plan.recovery.node_swap_s
    share = shrunk_nodes(plan) / plan.fleet.nodes
    training_again = limit + round_s + durable.restore_s
    stretch = max(0.0, delay_s - training_again)
    # The grow waits for the shrunk job's next durable commit (half an interval at the shrunk speed plus
    # the write, on average) and retrains only the steps between that commit and the restart.
    to_commit = durable.effective_s / 2 / share + durable.lag_s
    lost_at_grow = GROW_RETRAINED_STEPS * plan.workload.step_s
    return LossCost(
        idle_s=limit,
        recovery_s=2 * round_s,
        restore_s=2 * durable.restore_s,
        lost_s=durable.lost_s + lost_at_grow,
        shrunk_s=(stretch + to_commit) * (1 - share),
    )


def _policy(plan: Plan, costs: Mapping[TierName, TierCosts], strategy: Strategy) -> NodeLossPolicy:
    """model.evaluate's node-loss hook: a loss with a spare as usual, one without as `strategy` has it."""
    repair = plan.fleet.repair_hours * 3600.0

    def node_loss(usual: FaultCost, spares: Spares) -> FaultCost:
        p = spares.p_no_spare
        event = loss_cost(plan, costs, usual, delay_s=repair / (spares.spares + 1), strategy=strategy)
        return replace(
            usual,
            recovery_s=(1 - p) * usual.recovery_s + p * event.recovery_s,
            restore_s=(1 - p) * usual.restore_s + p * event.restore_s,
            lost_s=(1 - p) * usual.lost_s + p * event.lost_s,
            wait_s=p * event.idle_s,
            shrunk_s=p * event.shrunk_s,
        )

    return node_loss


def at_delay(plan: Plan, delay_s: float) -> Plan:
    """The plan with a lost node's replacement (or a repaired node) back after `delay_s`."""
    fleet = plan.fleet.model_copy(update={"repair_hours": delay_s / 3600.0})
    return plan.model_copy(update={"fleet": fleet})


@dataclass(frozen=True)
class ShrinkRow:
    delay_s: float
    wait: ModeResult
    shrink: ModeResult
    wait_per_loss_s: float
    """Seconds of the whole job one node loss without a spare costs, waiting."""
    shrink_per_loss_s: float

    @property
    def better(self) -> str:
        gap = self.wait_per_loss_s - self.shrink_per_loss_s
        if abs(gap) <= TIE_S:
            return "same"
        return "shrink" if gap > 0 else "wait"


@dataclass(frozen=True)
class ShrinkComparison:
    mode: Mode
    nodes: int
    shrunk_nodes: int
    pending_limit_s: float
    rows: list[ShrinkRow]
    break_even_s: float | None
    """The delay above which shrinking wins (None: not within MAX_DELAY_S)."""
    node_losses: float
    """Expected node losses over the run (the rows' first delay)."""
    spares: int


def _at(plan: Plan, mode: Mode, cadences: Mapping[TierName, int], delay_s: float) -> ShrinkRow:
    """Both strategies at one replacement delay: goodput, and what one loss without a spare costs."""
    delayed = at_delay(plan, delay_s).for_mode(mode)
    costs = tier_costs(delayed, mode, cadences)
    results = {
        strategy: evaluate(delayed, mode, cadences, node_loss=_policy(delayed, costs, strategy))
        for strategy in STRATEGIES
    }
    usual = fault_costs(delayed, mode, costs, wait_per_node_loss=0.0)["node"]
    first_back = delay_s / (results["wait"].spares.spares + 1)
    per_loss = {
        strategy: loss_cost(delayed, costs, usual, delay_s=first_back, strategy=strategy).total_s
        for strategy in STRATEGIES
    }
    return ShrinkRow(delay_s, results["wait"], results["shrink"], per_loss["wait"], per_loss["shrink"])


def break_even_s(plan: Plan, mode: Mode, cadences: Mapping[TierName, int]) -> float | None:
    """The smallest delay past which a shrink costs less per loss than waiting (to a second): past the
    pending limit waiting grows by the whole delay and a shrink by (1 - n_s / n) of it, so they cross
    once."""

    def gain(delay: float) -> float:
        row = _at(plan, mode, cadences, delay)
        return row.wait_per_loss_s - row.shrink_per_loss_s

    low, high = plan.shrink.pending_limit_s, MAX_DELAY_S
    if gain(high) <= TIE_S:
        return None
    while high - low > 1.0:
        middle = (low + high) / 2
        if gain(middle) > TIE_S:
            high = middle
        else:
            low = middle
    return high


def compare(plan: Plan, mode: Mode) -> ShrinkComparison:
    """Goodput of waiting and of shrinking at each of the plan's replacement delays, in `mode` at the
    cadences the plan recommends for it (held at every delay, so only the strategy differs)."""
    cadences = {t: i.every_steps for t, i in project(plan, mode).intervals.items()}
    rows = [_at(plan, mode, cadences, delay) for delay in plan.shrink.delays_s]
    first = rows[0].wait
    return ShrinkComparison(
        mode=mode,
        nodes=plan.fleet.nodes,
        shrunk_nodes=shrunk_nodes(plan),
        pending_limit_s=plan.shrink.pending_limit_s,
        rows=rows,
        break_even_s=break_even_s(plan, mode, cadences),
        node_losses=first.faults["node"],
        spares=first.spares.spares,
    )


def compare_all(plan: Plan) -> list[ShrinkComparison]:
    """The comparison for each of the plan's modes that can shrink (ft_launcher restarts at a new size);
    none when the plan leaves shrink.min_nodes unset."""
    if plan.shrink.min_nodes is None:
        return []
    return [compare(plan, mode) for mode in plan.modes if layers(mode).launcher == "ft_launcher"]


def rows_doc(comparison: ShrinkComparison) -> dict[str, object]:
    """The `--json` form of one comparison."""
    return {
        "mode": comparison.mode,
        "nodes": comparison.nodes,
        "shrunk_nodes": comparison.shrunk_nodes,
        "pending_limit_s": comparison.pending_limit_s,
        "break_even_s": comparison.break_even_s,
        "node_losses": comparison.node_losses,
        "spares": comparison.spares,
        "rows": [
            {
                "delay_s": row.delay_s,
                "wait_goodput": row.wait.training_goodput if row.wait.feasible else None,
                "shrink_goodput": row.shrink.training_goodput if row.shrink.feasible else None,
                "wait_per_loss_s": row.wait_per_loss_s,
                "shrink_per_loss_s": row.shrink_per_loss_s,
                "better": row.better,
            }
            for row in comparison.rows
        ],
    }


__all__ = ["LossCost", "ShrinkComparison", "ShrinkRow", "compare", "compare_all", "loss_cost"]
