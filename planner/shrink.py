"""Shrink instead of waiting, planned: what a node loss with no spare costs when the job waits for the
replacement, and when it shrinks (the job values' `shrink`), per capacity-replacement delay.

Per loss, in seconds of the whole job's work lost (mode `both`'s tiers and the plan's recovery):

- wait: the job idles `D` (the delay until the replacement's capacity comes), then recovers as any
  node loss: `node_swap_s` plus half a memory interval of lost work (the partner's RAM);
- shrink, when `D` exceeds the pending limit `L`: the job idles `L`, restarts on `P` of its `N` nodes
  (`node_swap_s`), restores the newest durable step resharded (`durable.restore_s`) and retrains the
  steps since it (half a durable interval plus its write); it then trains at `P / N` of its speed (the
  global batch kept) until the replacement comes and, at that speed, to its next durable step (half a
  durable interval on average), restarts at the full size and restores that step (`node_swap_s +
  durable.restore_s`), retraining the few steps since its commit (`GROW_RETRAINED_STEPS`).

`P` is `N - 1` (one node lost), not below `min_nodes`: the layout must run there (the job values check
it when they render). A day's training goodput then counts the plan's node losses per day (its fault
rate and the node-loss share of its mix), each costing the above, the other faults alike for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.profiles import get_profile

if TYPE_CHECKING:
    from nvrx_eks.planner.config import Plan

DELAYS_S = (600.0, 3600.0, 14400.0)
"""The replacement delays the table shows: 10 min, 1 h, 4 h."""
GROW_RETRAINED_STEPS = 6
"""Steps a grow retrains: those between the durable commit it restores and the restart (3-6 measured
by `nvrx-eks local shrink`: docs/measurements.md)."""
SECONDS_PER_DAY = 86400.0
_HOUR_S, _MINUTE_S = 3600, 60


@dataclass(frozen=True)
class ShrinkCosts:
    """What one node loss costs (seconds of the whole job's work) and a day's goodput, both ways."""

    delay_s: float
    wait_s: float
    shrink_s: float
    wait_goodput: float
    shrink_goodput: float

    @property
    def better(self) -> str:
        if self.shrink_s == self.wait_s:
            return "the same (the replacement comes before the job would shrink)"
        return "shrink" if self.shrink_s < self.wait_s else "wait"


@dataclass(frozen=True)
class ShrinkPlan:
    nodes: int
    gpus_per_node: int
    shrunk_nodes: int
    pending_limit_s: float
    node_losses_per_day: float
    rows: list[ShrinkCosts]
    break_even_s: float | None
    """The delay from which shrinking costs less (None: never, within a week)."""


def _interval_s(plan: Plan, tier: str) -> float:
    cadence = plan.modes["both"].tiers.get(tier)  # type: ignore[call-overload]
    if cadence == "auto":
        raise UserError(
            f"shrink against wait reads mode both's {tier} cadence in steps: give modes.both.tiers.{tier}"
        )
    return float(cadence or 0) * plan.workload.step_s


def loss_costs(plan: Plan, *, delay_s: float, min_nodes: int, pending_limit_s: float) -> tuple[float, float]:
    """(wait, shrink) seconds of the whole job's work one node loss with no spare costs at `delay_s`."""
    nodes = plan.fleet.nodes
    shrunk = max(min_nodes, nodes - 1)
    speed = shrunk / nodes
    swap = plan.recovery.node_swap_s
    durable = plan.checkpoint.durable
    restore, write = durable.restore_s, durable.write_s or 0.0
    wait = delay_s + swap + _interval_s(plan, "memory") / 2
    if delay_s <= pending_limit_s:
        return wait, wait  # the replacement came before the job would shrink
    half_durable = _interval_s(plan, "durable") / 2
    to_shrunk = pending_limit_s + swap + restore + half_durable + write
    shrunk_time = max(0.0, delay_s - pending_limit_s - swap - restore)
    slower = (shrunk_time + half_durable) * (1 - speed)
    grow = swap + restore + GROW_RETRAINED_STEPS * plan.workload.step_s
    return wait, to_shrunk + slower + grow


def shrink_plan(
    plan: Plan, *, min_nodes: int, pending_limit_s: float, delays_s: tuple[float, ...] = DELAYS_S
) -> ShrinkPlan:
    """Shrink against wait at each delay, for a plan with a node-loss rate (`faults.per_node_day`)."""
    nodes = plan.fleet.nodes
    if not 1 <= min_nodes < nodes:
        raise UserError(f"--shrink-min-nodes {min_nodes}: between 1 and fleet.nodes - 1 ({nodes - 1})")
    if pending_limit_s <= 0:
        raise UserError(f"--pending-limit {pending_limit_s:g}: a positive number of seconds")
    if plan.faults.per_node_day is None:
        raise UserError("shrink against wait needs a fault rate: give faults.per_node_day in the plan")
    if "durable" not in plan.modes["both"].tiers:
        raise UserError("shrink against wait needs mode both's durable cadence (modes.both.tiers.durable)")
    share = plan.faults.mix.get("node_loss", 0.0) / (sum(plan.faults.mix.values()) or 1.0)
    per_day = plan.faults.per_node_day * nodes * share
    rows = []
    for delay in delays_s:
        wait, shrink = loss_costs(plan, delay_s=delay, min_nodes=min_nodes, pending_limit_s=pending_limit_s)
        rows.append(
            ShrinkCosts(
                delay_s=delay,
                wait_s=wait,
                shrink_s=shrink,
                wait_goodput=max(0.0, 1 - per_day * wait / SECONDS_PER_DAY),
                shrink_goodput=max(0.0, 1 - per_day * shrink / SECONDS_PER_DAY),
            )
        )
    return ShrinkPlan(
        nodes=nodes,
        gpus_per_node=get_profile(plan.fleet.instance_profile).workers_per_node,
        shrunk_nodes=max(min_nodes, nodes - 1),
        pending_limit_s=pending_limit_s,
        node_losses_per_day=per_day,
        rows=rows,
        break_even_s=_break_even(plan, min_nodes=min_nodes, pending_limit_s=pending_limit_s),
    )


def _break_even(plan: Plan, *, min_nodes: int, pending_limit_s: float) -> float | None:
    """The least delay (to the second, up to a week) from which a shrink costs less than the wait."""

    def gain(delay: float) -> float:
        wait, shrink = loss_costs(plan, delay_s=delay, min_nodes=min_nodes, pending_limit_s=pending_limit_s)
        return wait - shrink

    low, high = pending_limit_s, 7 * SECONDS_PER_DAY
    if gain(high) <= 0:
        return None
    while high - low > 1.0:  # the gain grows with the delay: the job trains while it would wait
        middle = (low + high) / 2
        low, high = (middle, high) if gain(middle) <= 0 else (low, middle)
    return high


def table_lines(result: ShrinkPlan) -> list[str]:
    """The shrink-against-wait table as Markdown rows, and the break-even delay."""
    head = (
        f"Shrink instead of waiting: {result.nodes} nodes -> {result.shrunk_nodes} after a "
        f"{result.pending_limit_s:g} s pending limit; {result.node_losses_per_day:.3f} node losses a day, "
        "each without a spare"
    )
    columns = (
        "| replacement delay | cost per loss, wait (s) | cost per loss, shrink (s) "
        "| GPU-hours saved per loss | goodput/day, wait | goodput/day, shrink | better |"
    )
    gpus = result.nodes * result.gpus_per_node
    rows = [
        f"| {_delay(row.delay_s)} | {row.wait_s:,.0f} | {row.shrink_s:,.0f} | "
        f"{(row.wait_s - row.shrink_s) * gpus / _HOUR_S:,.1f} | {row.wait_goodput:.2%} | "
        f"{row.shrink_goodput:.2%} | {row.better} |"
        for row in result.rows
    ]
    even = result.break_even_s
    verdict = (
        f"Shrinking costs less from a replacement delay of {_delay(even)}"
        if even is not None
        else "Shrinking never costs less within a week of delay"
    )
    return [head, "", columns, "|---|---|---|---|---|---|---|", *rows, "", verdict]


def _delay(seconds: float) -> str:
    if seconds >= _HOUR_S and seconds % _HOUR_S == 0:
        return f"{seconds / _HOUR_S:g} h"
    if seconds >= _MINUTE_S:
        return f"{seconds / _MINUTE_S:.0f} min"
    return f"{seconds:.0f} s"
