"""A seeded discrete-event simulation of the run, to check the closed form (planner/model.py).

It plays what the closed form averages: faults drawn one by one (a Poisson process in wall time for a
rate, or a fixed count spread over the steps as the kit's fault schedule does, training/faults.py),
each routed to its layer (`model.route`); a restore loads the newest checkpoint that is committed at the
moment of the fault on a tier the route may use (a persist still in flight does not count; a node loss
wipes the node-local tiers of the lost node and a store loss every node's RAM, so they count again only
from their next snapshot); replayed steps cross checkpoints again and pay their stall again; faults
also strike during a recovery, which then starts over; node losses take a spare from a pool of warm
spares, and a failed node returns after an exponential repair time (mean `repair_hours`) -- with no
spare left the job waits for the first return.

Simplifications it shares with the closed form (said here so a reader knows what is not checked): a
persist due while the previous one runs is skipped (the cadence coalesces to the effective interval),
and within a stretch of training the checkpoint stall is spread evenly when a wall-clock fault time is
turned into progress.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nvrx_eks.planner.config import SECONDS_PER_DAY, TIERS, FaultKind, Plan, TierName, fault_kind
from nvrx_eks.planner.model import layer_recovery_s, route, tier_costs

if TYPE_CHECKING:
    from collections.abc import Mapping

    from nvrx_eks.planner.model import TierCosts
    from nvrx_eks.training.resilience.modes import Mode


@dataclass(frozen=True)
class SimResult:
    mode: Mode
    runs: int
    training_goodput: float
    """Mean over the runs."""
    stdev: float
    badput: dict[str, float]
    faults_per_run: float
    waits_per_run: float


class _Run:
    def __init__(
        self, plan: Plan, mode: Mode, costs: Mapping[TierName, TierCosts], rng: random.Random, spares: int
    ) -> None:
        self.plan, self.mode, self.costs, self.rng = plan, mode, costs, rng
        self.step = plan.workload.step_s
        self.sigma = sum(c.stall_s / c.interval_s for c in costs.values())
        self.t = plan.workload.startup_s
        self.p = 0.0
        # Per tier: progress of the newest committed checkpoint (-1: none usable yet), and the
        # progress below which the tier holds nothing (after a node loss wiped it).
        self.committed: dict[TierName, float] = dict.fromkeys(costs, 0.0)
        self.stall = self.lost = self.recovery = self.wait = 0.0
        self.faults = self.waits = 0
        self.free_spares = spares
        self.returns: list[float] = []
        self.repair_s = plan.fleet.repair_hours * 3600.0
        weights = plan.faults.class_weights(plan.fleet.nodes)
        self.classes, self.weights = list(weights), list(weights.values())

    # ---- training ------------------------------------------------------------------------------------
    def _crossings(self, a: float, b: float, every: float) -> int:
        return max(0, math.floor(b / every + 1e-9) - math.floor(a / every + 1e-9))

    def _stall_between(self, a: float, b: float) -> float:
        return sum(c.stall_s * self._crossings(a, b, c.effective_s) for c in self.costs.values() if c.stall_s)

    def train_to(self, target: float) -> None:
        """Train from the current progress to `target`, committing checkpoints on the way."""
        start_p, start_t = self.p, self.t
        stall = self._stall_between(start_p, target)
        self.stall += stall
        self.t += (target - start_p) + stall
        self.p = target
        self._segment = (start_p, start_t)

    def committed_at_fault(self, name: TierName) -> float:
        """Newest checkpoint of `name` committed now (the current segment's, else the one before)."""
        cost = self.costs[name]
        start_p, start_t = self._segment
        newest = math.floor(self.p / cost.effective_s + 1e-9) * cost.effective_s
        if newest > start_p:
            crossed_t = start_t + (newest - start_p) + self._stall_between(start_p, newest)
            if crossed_t + cost.lag_s <= self.t + 1e-9:
                return newest
            previous = newest - cost.effective_s
            if previous > start_p:
                return previous
        return self.committed[name]

    # ---- faults --------------------------------------------------------------------------------------
    def _draw_class(self) -> FaultKind:
        return fault_kind(self.rng.choices(self.classes, self.weights)[0])

    def _spare(self) -> float:
        """Take a spare for a lost node; returns the wait for capacity."""
        while self.returns and self.returns[0] <= self.t:
            heapq.heappop(self.returns)
            self.free_spares += 1
        wait = 0.0
        if self.free_spares > 0:
            self.free_spares -= 1
        elif self.returns:
            wait = heapq.heappop(self.returns) - self.t
            self.waits += 1
        else:  # no spare and none in repair: the lost node itself must come back
            wait = self.rng.expovariate(1 / self.repair_s)
            self.waits += 1
        heapq.heappush(self.returns, self.t + wait + self.rng.expovariate(1 / self.repair_s))
        return wait

    def fault(self, kind: FaultKind) -> tuple[float, float]:
        """Roll back for a fault at the current moment; returns (recovery, capacity wait) it starts."""
        self.faults += 1
        r = route(self.plan, self.mode, kind)
        now = {t: self.committed_at_fault(t) for t in self.costs}
        usable = [t for t in r.tiers if t in self.costs and now[t] >= 0]
        restore_s = 0.0
        if not r.tiers:
            restored = max(0.0, self.p - self.step / 2)  # in-process: the interrupted step is redone
        elif usable:
            tier = max(usable, key=lambda t: (now[t], -self.costs[t].restore_s))
            restored, restore_s = now[tier], self.costs[tier].restore_s
        else:
            restored = 0.0
        self.lost += self.p - restored
        self.p = restored
        for name in self.costs:
            # A node loss wipes the lost node's tiers a restore may not use; a store loss every node's RAM.
            wiped = kind in {"node", "store"} and name not in r.tiers
            self.committed[name] = -1.0 if wiped else min(now[name], restored)
        wait = self._spare() if kind == "node" else 0.0
        return layer_recovery_s(self.plan, r.layer) + restore_s, wait

    def recover(self, costs: tuple[float, float], rate: float | None) -> None:
        """Sit out a wait for capacity, then a recovery; a fault during either (rate plans) starts over."""
        recovery, wait = costs
        while True:
            gap = self.rng.expovariate(rate) if rate else math.inf
            elapsed = min(gap, recovery + wait)
            self.t += elapsed
            self.wait += min(elapsed, wait)
            self.recovery += max(0.0, elapsed - wait)
            self._segment = (self.p, self.t)
            if gap >= recovery + wait:
                return
            recovery, wait = self.fault(self._draw_class())


def _run_once(
    plan: Plan, mode: Mode, cadences: Mapping[TierName, int], rng: random.Random, spares: int
) -> _Run:
    run = _Run(plan, mode, tier_costs(plan, mode, cadences), rng, spares)
    run._segment = (0.0, run.t)  # noqa: SLF001 - set before the first stretch of training
    rate = plan.fault_rate()
    useful = plan.useful_s
    if rate is None:
        assert useful is not None  # noqa: S101 - validated: a count needs a length in steps
        step_s = plan.workload.step_s
        if plan.faults.schedule is not None:
            # A replayed run: its faults at their steps (mid-step, as the injector fires before backward).
            faults = [((s - 0.5) * step_s, fault_kind(c)) for c, s in plan.faults.scheduled()]
        else:
            count = plan.faults.count or 0
            steps = plan.workload.steps or 0
            slot = max(1, steps // max(1, count))
            # One fault per slot of the run at a random step inside it, as training/faults.py draws
            # them; each fires once, the first time its step is reached (replays do not fire it again).
            faults = [
                ((i * slot + rng.randint(0, slot - 1) + 0.5) * step_s, run._draw_class())  # noqa: SLF001
                for i in range(count)
            ]
        for point, kind in sorted(faults):
            run.train_to(point)
            run.recover(run.fault(kind), None)
        run.train_to(useful)
        return run
    end_wall = None if useful is not None else plan.workload.days * SECONDS_PER_DAY  # type: ignore[operator]
    while True:
        gap = rng.expovariate(rate)
        progress = run.p + gap / (1 + run.sigma)
        if useful is not None and progress >= useful:
            run.train_to(useful)
            return run
        if end_wall is not None and run.t + gap >= end_wall:
            run.train_to(run.p + (end_wall - run.t) / (1 + run.sigma))
            return run
        run.train_to(progress)
        run.recover(run.fault(run._draw_class()), rate)  # noqa: SLF001
        if end_wall is not None and run.t >= end_wall:
            return run


def simulate(
    plan: Plan, mode: Mode, cadences: Mapping[TierName, int], *, spares: int, runs: int = 200, seed: int = 0
) -> SimResult:
    """Mean training goodput (and badput split) over `runs` seeded runs with `spares` warm spares."""
    plan = plan.for_mode(mode)
    rng = random.Random(seed)  # noqa: S311 - a seeded simulation, not cryptography
    goodputs: list[float] = []
    parts = {"checkpoint_stall": 0.0, "lost_work": 0.0, "recovery": 0.0, "capacity_wait": 0.0, "startup": 0.0}
    faults = waits = 0
    for _ in range(runs):
        run = _run_once(plan, mode, cadences, random.Random(rng.getrandbits(64)), spares)  # noqa: S311
        wall = run.t
        goodputs.append(run.p / wall)
        parts["checkpoint_stall"] += run.stall / wall
        parts["lost_work"] += run.lost / wall
        parts["recovery"] += run.recovery / wall
        parts["capacity_wait"] += run.wait / wall
        parts["startup"] += plan.workload.startup_s / wall
        faults += run.faults
        waits += run.waits
    return SimResult(
        mode=mode,
        runs=runs,
        training_goodput=statistics.fmean(goodputs),
        stdev=statistics.stdev(goodputs) if runs > 1 else 0.0,
        badput={k: v / runs for k, v in parts.items()},
        faults_per_run=faults / runs,
        waits_per_run=waits / runs,
    )


__all__ = ["TIERS", "SimResult", "simulate"]
