"""The closed form: interval per tier (Young/Daly, bounded), expected goodput per mode, Poisson spares.

What a fault costs depends on who recovers it (docs/architecture.md, the fault table) and where the
state comes back from. Per mode and fault kind (`route`):

| kind    | baseline              | inprocess             | ft_launcher          | both                  |
|---------|-----------------------|-----------------------|----------------------|-----------------------|
| soft    | job restart, own node | in-process, none      | launcher, own node   | in-process, none      |
| process | job restart, own node | job restart, own node | launcher, own node   | launcher, own node    |
| node    | job restart, remote   | job restart, remote   | spare swap, remote   | spare swap, remote    |
| store   | store restart, disk   | store restart, disk   | store restart, disk  | store restart, disk   |

"own node": any tier the mode writes; "remote": durable, plus memory with peer replicas; "disk": the
node-local disk or durable, never memory. A store loss (the rendezvous store's pod lost) ends every
launcher in every mode (each rendezvouses through the store; NVRx 0.7's do not reconnect): the Job
restarts every pod on its node, so the RAM tier goes with the processes and each resumes from the newest
checkpoint its node still holds -- it loses the local interval, not the memory one. A restore
loads the newest checkpoint of the usable tiers; an in-process restart redoes only the interrupted
step. Each fault then costs recovery (its layer) + restore (its tier) + lost work + for a node loss the
wait for capacity when no spare is left.

Lost work after a restore from a tier written every tau with a background write of w: tau/2 (the
fault is uniform over the interval) + w (the newest persist is still in flight), with tau the effective
interval: a persist due while the previous one runs is skipped (training/checkpoint), so a cadence
shorter than w writes every ceil(w/tau) x tau. A blocking tier commits at once and pays w as stall.

Wall time, for U seconds of useful work, sigma = sum of stall/interval over the tiers, startup S0 and
fault rate lambda_k per kind with cost c_k:
- a fixed count n_k of faults per run: W = U (1 + sigma) + S0 + sum n_k c_k
- a rate: W = (U (1 + sigma) + S0) / (1 - sum lambda_k c_k) (faults also strike during recoveries)
and training goodput = U / W (docs/measurements.md, how we measure), the rest split into checkpoint
stall, lost work, recovery, capacity wait, training shrunk (planner/shrink.py: a node loss that trains on
at a smaller size instead of waiting for capacity) and startup.

Interval (Young, CACM 1974; Daly, FGCS 2006): for a tier whose restores happen at rate 1/M and whose
checkpoint blocks the loop for C, tau = sqrt(2 M C) (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C (tau = M
once C >= 2M). With async checkpoints C is the blocking stall only; the interval must also exceed the
background write, be a whole number of steps, and (disk tiers persisting the memory snapshot) a
multiple of the memory cadence. A tier no fault restores from is written every `max_interval_s`.

Spares (M/G/inf): nodes fail at rate lambda per node and stay out `repair_hours`, so the number out at
a given moment is Poisson with mean mu = nodes x lambda x repair; a node loss finds no spare with
probability P(X >= spares). The run's waits are then about Poisson with mean F x P(X >= spares) over F
node losses: the plan picks the fewest spares with exp(-F P(X >= spares)) >= spare_target. A wait
lasts until the first of the spares + 1 nodes out returns: repair / (spares + 1) on average. This is a
light-load approximation: it holds while the spares cover the losses (the recommended count or more);
far below it the job queues behind its own repairs and the simulation (planner/simulate.py) is the
figure to trust -- the report warns when the plan's spares are below the recommendation.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from nvrx_eks.planner.config import (
    SECONDS_PER_DAY,
    TIERS,
    FaultKind,
    Plan,
    TierName,
    fault_kind,
    poisson_fewest,
    poisson_tail,
)
from nvrx_eks.training.resilience.modes import MODES, Mode, layers

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    NodeLossPolicy = Callable[["FaultCost", "Spares"], "FaultCost"]

KINDS: tuple[FaultKind, ...] = ("soft", "process", "node", "store")
MAX_SPARES = 100_000


@dataclass(frozen=True)
class Route:
    layer: str
    """inprocess, ft_launcher, job_restart, node_swap or store_restart."""
    tiers: tuple[TierName, ...]
    """Tiers a restore may load from (empty: an in-process restart, parameters never left)."""


def route(plan: Plan, mode: Mode, kind: FaultKind) -> Route:
    written = tuple(t for t in TIERS if t in plan.modes[mode].tiers)
    remote = tuple(t for t in written if t == "durable" or (t == "memory" and plan.checkpoint.peer_replica))
    spec = layers(mode)
    if kind == "soft" and spec.inprocess:
        return Route("inprocess", ())
    if kind == "store":
        return Route("store_restart", tuple(t for t in written if t != "memory"))
    # ft_launcher restarts a node's workers in place and, with the job's rendezvous, takes a node's
    # replacement in; torchrun's job is restarted whole from a checkpoint.
    in_job = spec.launcher == "ft_launcher"
    if kind == "node":
        return Route("node_swap" if in_job else "job_restart", remote)
    return Route("ft_launcher" if in_job else "job_restart", written)


def layer_recovery_s(plan: Plan, layer: str) -> float:
    r = plan.recovery
    return {
        "inprocess": r.inprocess_s,
        "ft_launcher": r.launcher_s,
        "job_restart": r.job_restart_s,
        "node_swap": r.node_swap_s,
        "store_restart": r.store_restart_s(),
    }[layer]


@dataclass(frozen=True)
class TierCosts:
    """One tier as a mode writes it."""

    every_steps: int
    interval_s: float
    effective_s: float
    """The interval persists actually land at (coalesced when the write outlasts the cadence)."""
    stall_s: float
    """Loop time this tier adds per checkpoint in this mode."""
    lag_s: float
    """How long after it is due a checkpoint is committed (its background write)."""
    restore_s: float

    @property
    def lost_s(self) -> float:
        return self.effective_s / 2 + self.lag_s


def tier_costs(plan: Plan, mode: Mode, cadences: Mapping[TierName, int]) -> dict[TierName, TierCosts]:
    step = plan.workload.step_s
    with_memory = "memory" in cadences
    out: dict[TierName, TierCosts] = {}
    for name, every in cadences.items():
        tier = plan.checkpoint.tier(name)
        assert tier is not None  # noqa: S101 - validated by Plan
        interval = every * step
        write = 0.0 if name == "memory" else plan.write_s(name)
        if tier.blocking:
            stall, lag, effective = plan.stall_s(name), 0.0, interval
        else:
            # A disk tier persisting the memory snapshot adds no stall of its own.
            stall = 0.0 if (with_memory and name != "memory") else plan.stall_s(name)
            lag = plan.stall_s(name) if name == "memory" else write
            effective = interval * max(1, math.ceil(write / interval - 1e-9)) if write > 0 else interval
        out[name] = TierCosts(
            every_steps=every,
            interval_s=interval,
            effective_s=effective,
            stall_s=stall,
            lag_s=lag,
            restore_s=tier.restore_s,
        )
    del mode
    return out


def restore_choice(route_: Route, costs: Mapping[TierName, TierCosts]) -> TierName | None:
    """The tier a restore loads from: the newest checkpoint among the usable tiers, fastest on a tie."""
    usable: list[TierName] = [t for t in route_.tiers if t in costs]
    if not usable:
        return None
    choice: TierName = min(usable, key=lambda t: (costs[t].lost_s, costs[t].restore_s))
    return choice


@dataclass(frozen=True)
class FaultCost:
    kind: FaultKind
    layer: str
    tier: str | None
    recovery_s: float
    restore_s: float
    lost_s: float
    wait_s: float
    shrunk_s: float = 0.0
    """Training below full size while a lost node's replacement is away (shrink): the progress the
    missing nodes would have made, in seconds of the whole job."""

    @property
    def total_s(self) -> float:
        return self.recovery_s + self.restore_s + self.lost_s + self.wait_s + self.shrunk_s


@dataclass(frozen=True)
class Spares:
    spares: int
    recommended: int
    mean_out: float
    """Nodes out for repair at a random moment (Poisson mean)."""
    node_losses: float
    """Expected node losses over the run."""
    p_no_spare: float
    """Chance a node loss finds no spare."""
    p_never_wait: float
    wait_per_loss_s: float
    """Expected capacity wait per node loss (p_no_spare x repair / (spares + 1))."""
    source: str


def size_spares(plan: Plan, *, node_rate_per_node_s: float, wall_s: float) -> Spares:
    fleet = plan.fleet
    repair = fleet.repair_hours * 3600.0
    mean_out = fleet.nodes * node_rate_per_node_s * repair
    losses = fleet.nodes * node_rate_per_node_s * wall_s

    def never_wait(spares: int) -> float:
        return math.exp(-losses * poisson_tail(mean_out, spares))

    # The fewest spares that meet the target: exp(-losses * P(out >= k)) >= target, that is
    # P(out >= k) <= -ln(target) / losses (never_wait grows with the spares).
    bound = -math.log(fleet.spare_target) / losses if losses > 0 else 1.0
    recommended = int(min(poisson_fewest(mean_out, bound), MAX_SPARES))
    spares = fleet.spares if fleet.spares is not None else recommended
    tail = poisson_tail(mean_out, spares)
    return Spares(
        spares=spares,
        recommended=recommended,
        mean_out=mean_out,
        node_losses=losses,
        p_no_spare=tail,
        p_never_wait=never_wait(spares),
        wait_per_loss_s=tail * repair / (spares + 1),
        source="the plan's" if fleet.spares is not None else "sized by the plan",
    )


@dataclass(frozen=True)
class Interval:
    tier: TierName
    every_steps: int
    seconds: float
    bound: str
    """What set it: young-daly (the optimum), write time (an async tier's background write), one step,
    memory cadence (disk tiers persist the memory snapshot), max interval (no fault restores from this
    tier: `max_interval_s`), fixed (the plan's cadence)."""
    young_daly_s: float | None
    write_s: float
    stall_s: float
    mtbf_s: float | None
    """Mean time between the faults that restore from this tier."""
    note: str = ""


@dataclass
class ModeResult:
    mode: Mode
    training_goodput: float
    badput: dict[str, float]
    intervals: dict[TierName, Interval]
    faults: dict[FaultKind, float]
    """Expected faults per kind over the run."""
    fault_costs: dict[FaultKind, FaultCost]
    wall_s: float
    useful_s: float
    gpu_hours_lost_per_day: float
    spares: Spares
    feasible: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "training_goodput": self.training_goodput,
            "badput": self.badput,
            "intervals": {t: asdict(i) for t, i in self.intervals.items()},
            "faults_expected": self.faults,
            "fault_costs": {k: asdict(c) for k, c in self.fault_costs.items()},
            "wall_s": self.wall_s,
            "useful_s": self.useful_s,
            "gpu_hours_lost_per_day": self.gpu_hours_lost_per_day,
            "spares": asdict(self.spares),
            "feasible": self.feasible,
        }


def daly(mtbf_s: float, stall_s: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints (Young's sqrt(2MC) to first order)."""
    if stall_s <= 0:
        return 0.0
    if stall_s >= 2 * mtbf_s:
        return mtbf_s
    x = stall_s / (2 * mtbf_s)
    return math.sqrt(2 * mtbf_s * stall_s) * (1 + math.sqrt(x) / 3 + x / 9) - stall_s


@dataclass(frozen=True)
class _Rates:
    per_kind: dict[FaultKind, float]
    """Faults per wall second (rate plans) or per run (count plans)."""
    is_rate: bool


def _rates(plan: Plan) -> _Rates:
    shares = plan.faults.kind_shares()
    if plan.fault_rate() is not None:
        per_second = dict.fromkeys(KINDS, 0.0)
        for cls, per_day in plan.faults.class_weights(plan.fleet.nodes).items():
            per_second[fault_kind(cls)] += per_day / SECONDS_PER_DAY
        return _Rates(per_second, is_rate=True)
    if plan.faults.schedule is not None:
        counts = dict.fromkeys(KINDS, 0.0)
        for cls, _ in plan.faults.scheduled():
            counts[fault_kind(cls)] += 1
        return _Rates(counts, is_rate=False)
    count = plan.faults.count or 0
    return _Rates({k: count * shares[k] for k in KINDS}, is_rate=False)


def scheduled_lost_s(plan: Plan, cost: TierCosts, step: int) -> float:
    """Work lost by a fault at `step` (mid-step) restoring from a tier: back to its newest committed
    checkpoint (a persist still in flight does not count; none yet: back to the start)."""
    step_s = plan.workload.step_s
    at = (step - 0.5) * step_s
    newest = math.floor(at / cost.effective_s + 1e-9) * cost.effective_s
    if at - newest < cost.lag_s:
        newest -= cost.effective_s
    return at - max(0.0, newest)


def _restore_rates(plan: Plan, mode: Mode, *, wall_guess_s: float) -> dict[TierName, float]:
    """Restores per second each tier serves: with nested cadences the first usable tier is the newest."""
    setup = plan.modes[mode].tiers
    rates = _rates(plan)
    out: dict[TierName, float] = dict.fromkeys(setup, 0.0)
    for kind in KINDS:
        usable = [t for t in route(plan, mode, kind).tiers if t in setup]
        if usable:
            out[usable[0]] += rates.per_kind[kind] / (1.0 if rates.is_rate else wall_guess_s)
    return out


def _auto_steps(
    *, target: float, bound: str, floors: list[tuple[float, str]], step: float, memory_steps: int | None
) -> tuple[int, str]:
    """Whole steps for a target interval, raised to its floors and to a multiple of the memory cadence."""
    low, low_bound = max(floors)
    if target <= low:
        target, bound = low, low_bound
    steps = max(1, round(target / step) if bound == "young-daly" else math.ceil(target / step - 1e-9))
    if memory_steps:
        multiple = max(math.ceil(steps / memory_steps) * memory_steps, memory_steps)
        if steps < memory_steps:
            bound = "memory cadence"
        steps = multiple
    return steps, bound


def recommend(plan: Plan, mode: Mode, *, wall_guess_s: float) -> dict[TierName, Interval]:
    """The interval per tier the mode writes: fixed ones kept, `auto` ones bounded Young/Daly."""
    setup = plan.modes[mode].tiers
    step = plan.workload.step_s
    restore_rate = _restore_rates(plan, mode, wall_guess_s=wall_guess_s)
    run_cap = plan.useful_s or plan.workload.days * SECONDS_PER_DAY  # type: ignore[operator]
    out: dict[TierName, Interval] = {}
    memory_steps: int | None = None
    for name in (t for t in TIERS if t in setup):
        tier = plan.checkpoint.tier(name)
        assert tier is not None  # noqa: S101 - validated by Plan
        write = 0.0 if name == "memory" else plan.write_s(name)
        with_memory = "memory" in setup and name != "memory"
        stall = plan.stall_s(name) if (tier.blocking or not with_memory) else 0.0
        mtbf = 1 / restore_rate[name] if restore_rate[name] > 0 else None
        yd = daly(mtbf, stall) if mtbf is not None else None
        fixed = setup[name]
        if fixed != "auto":
            late = not tier.blocking and write > fixed * step
            note = f"shorter than its {write:.0f} s write: persists coalesce" if late else ""
            out[name] = Interval(name, fixed, fixed * step, "fixed", yd, write, stall, mtbf, note)
        else:
            if yd is None:
                target, bound = min(plan.max_interval_s, run_cap), "max interval"
            else:
                target, bound = yd, "young-daly"
            floors = [(step, "one step")]
            if not tier.blocking and write > 0:
                floors.append((write, "write time"))
            every, bound = _auto_steps(
                target=target,
                bound=bound,
                floors=floors,
                step=step,
                memory_steps=memory_steps if with_memory else None,
            )
            out[name] = Interval(name, every, every * step, bound, yd, write, stall, mtbf)
        if name == "memory":
            memory_steps = out[name].every_steps
    return out


def fault_costs(
    plan: Plan, mode: Mode, costs: Mapping[TierName, TierCosts], *, wait_per_node_loss: float
) -> dict[FaultKind, FaultCost]:
    """What one fault of each kind costs in `mode`: its layer's recovery, the restore and the work lost
    from the tier it restores from, and (a node loss) the wait for a spare."""
    step = plan.workload.step_s
    scheduled = plan.faults.scheduled()
    out: dict[FaultKind, FaultCost] = {}
    for kind in KINDS:
        r = route(plan, mode, kind)
        tier = restore_choice(r, costs)
        lost = step / 2 if tier is None else costs[tier].lost_s
        restore = 0.0 if tier is None else costs[tier].restore_s
        at_steps = [s for cls, s in scheduled if fault_kind(cls) == kind]
        if at_steps and tier is not None:
            # A replayed run: each fault's own lost work, from the tier whose checkpoint is newest.
            usable: list[TierName] = [t for t in r.tiers if t in costs]
            picks = [
                min(usable, key=lambda t, s=s: scheduled_lost_s(plan, costs[t], s))  # type: ignore[misc]
                for s in at_steps
            ]
            lost = statistics.fmean(
                scheduled_lost_s(plan, costs[t], s) for t, s in zip(picks, at_steps, strict=True)
            )
            restore = statistics.fmean(costs[t].restore_s for t in picks)
        out[kind] = FaultCost(
            kind=kind,
            layer=r.layer,
            tier=tier,
            recovery_s=layer_recovery_s(plan, r.layer),
            restore_s=restore,
            lost_s=lost,
            wait_s=wait_per_node_loss if kind == "node" else 0.0,
        )
    return out


def evaluate(
    plan: Plan,
    mode: Mode,
    cadences: Mapping[TierName, int],
    *,
    intervals: dict[TierName, Interval] | None = None,
    node_loss: NodeLossPolicy | None = None,
) -> ModeResult:
    """Expected goodput of `mode` writing each tier every `cadences[tier]` steps. `node_loss` rewrites
    what a node loss costs once the spares are known (planner/shrink.py: shrink instead of waiting);
    without it a loss that finds no spare waits for one."""
    plan = plan.for_mode(mode)
    costs = tier_costs(plan, mode, cadences)
    rates = _rates(plan)
    useful = plan.useful_s
    sigma = sum(c.stall_s / c.interval_s for c in costs.values())
    startup = plan.workload.startup_s

    def per_fault(spares: Spares | None) -> dict[FaultKind, FaultCost]:
        wait = spares.wait_per_loss_s if spares is not None else 0.0
        out = fault_costs(plan, mode, costs, wait_per_node_loss=wait)
        if node_loss is not None and spares is not None:
            out["node"] = node_loss(out["node"], spares)
        return out

    def wall_for(fcosts: dict[FaultKind, FaultCost]) -> tuple[float, float, dict[FaultKind, float]]:
        """(wall, useful, expected faults per kind)."""
        if rates.is_rate:
            load = sum(rates.per_kind[k] * fcosts[k].total_s for k in KINDS)
            if useful is not None:
                wall = (useful * (1 + sigma) + startup) / (1 - load) if load < 1 else math.inf
                used = useful
            else:
                wall = plan.workload.days * SECONDS_PER_DAY  # type: ignore[operator]
                used = max(0.0, (wall * (1 - load) - startup) / (1 + sigma))
            return wall, used, {k: rates.per_kind[k] * wall for k in KINDS}
        assert useful is not None  # noqa: S101 - a count needs a length in steps (validated)
        counts = dict(rates.per_kind)
        wall = useful * (1 + sigma) + startup + sum(counts[k] * fcosts[k].total_s for k in KINDS)
        return wall, useful, counts

    fcosts = per_fault(None)
    wall, used, counts = wall_for(fcosts)
    spares = _spares(plan, counts, wall)
    for _ in range(3):  # the capacity wait lengthens the run, which changes the node losses a little
        fcosts = per_fault(spares)
        wall, used, counts = wall_for(fcosts)
        spares = _spares(plan, counts, wall)
    feasible = math.isfinite(wall) and used > 0
    if not feasible:
        return ModeResult(
            mode,
            0.0,
            {},
            intervals or {},
            counts,
            fcosts,
            wall,
            used,
            plan.fleet.gpus * 24.0,
            spares,
            feasible=False,
        )
    badput = {
        "checkpoint_stall": used * sigma / wall,
        "lost_work": sum(counts[k] * fcosts[k].lost_s for k in KINDS) / wall,
        "recovery": sum(counts[k] * (fcosts[k].recovery_s + fcosts[k].restore_s) for k in KINDS) / wall,
        "capacity_wait": sum(counts[k] * fcosts[k].wait_s for k in KINDS) / wall,
        "shrunk": sum(counts[k] * fcosts[k].shrunk_s for k in KINDS) / wall,
        "startup": startup / wall,
    }
    goodput = used / wall
    return ModeResult(
        mode=mode,
        training_goodput=goodput,
        badput=badput,
        intervals=intervals or {},
        faults=counts,
        fault_costs=fcosts,
        wall_s=wall,
        useful_s=used,
        gpu_hours_lost_per_day=(1 - goodput) * plan.fleet.gpus * 24.0,
        spares=spares,
    )


def _spares(plan: Plan, counts: Mapping[FaultKind, float], wall: float) -> Spares:
    finite = wall if math.isfinite(wall) else 1e12
    per_node_s = counts["node"] / finite / plan.fleet.nodes
    return size_spares(plan, node_rate_per_node_s=per_node_s, wall_s=finite)


def _first_guess_wall(plan: Plan) -> float:
    if plan.useful_s is not None:
        return plan.useful_s * 1.5 + plan.workload.startup_s
    return plan.workload.days * SECONDS_PER_DAY  # type: ignore[operator]


def project(plan: Plan, mode: Mode) -> ModeResult:
    """Recommended intervals for `mode`, then its expected goodput at them."""
    plan = plan.for_mode(mode)
    wall = _first_guess_wall(plan)
    intervals: dict[TierName, Interval] = {}
    result: ModeResult | None = None
    for _ in range(3):  # count plans: the rate per second depends on the wall time it produces
        intervals = recommend(plan, mode, wall_guess_s=wall)
        result = evaluate(plan, mode, {t: i.every_steps for t, i in intervals.items()}, intervals=intervals)
        if plan.fault_rate() is not None or not result.feasible:
            break
        wall = result.wall_s
    assert result is not None  # noqa: S101
    return result


@dataclass
class Projection:
    plan: Plan
    modes: dict[Mode, ModeResult] = field(default_factory=dict)


def project_all(plan: Plan) -> Projection:
    return Projection(plan, {m: project(plan, m) for m in MODES if m in plan.modes})
