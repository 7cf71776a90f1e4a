"""The plan's input: a typed tree loaded from a small YAML file plus `key=value` overrides.

Every number either comes from the plan file, from a run this kit measured (`--from`, see
planner/calibrate.py), or from a default below whose source is named beside it. The report says which.
"""

from __future__ import annotations

import math
import warnings
from functools import cached_property
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from scipy.stats import poisson

from nvrx_eks.k8s.sections import Shrink
from nvrx_eks.kitcore.configio import StaleInput
from nvrx_eks.kitcore.profiles import InstanceProfile, get_profile, profile_for_field
from nvrx_eks.training.checkpoint.config import CADENCE_TIERS, CadenceTier
from nvrx_eks.training.resilience.config import ParallelConfig, parse_plan_item
from nvrx_eks.training.resilience.modes import FAULT_CLASSES, MODES, SOFT_FAULTS, Mode, layers
from nvrx_eks.training.shapes import PRESETS, ModelShape

TierName = CadenceTier
TIERS = CADENCE_TIERS
FaultKind = Literal["soft", "process", "node", "store"]
SECONDS_PER_DAY = 86400.0
RENAMED_MODE = "kit"
"""The planner's former name for the mode `both`: a plan file naming it is read as `both`, with a warning."""

# ---- published defaults, each with its source ------------------------------------------------------
# Llama 3 (Dubey et al., "The Llama 3 Herd of Models", 2024, section 3.3.4 and Table 5): 419 unexpected
# interruptions in a 54-day snapshot of 405B pre-training on 16,384 H100 (2,048 hosts of 8); about 78%
# confirmed or suspected hardware; "higher than 90% effective training time".
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16384
LLAMA3_NODES = LLAMA3_GPUS // 8
LLAMA3_EFFECTIVE_TRAINING_TIME = 0.90
# Table 5 rows (interruptions), mapped onto the kit's fault classes (training/faults.py) by what it
# takes to recover. The mapping is this plan's assumption, not Meta's: a failed GPU, HBM3, SRAM, GPU
# system processor, thermal interface, NIC, switch/cable, SSD, PSU, chassis, IO board, CPU or DIMM
# takes the host out (node_loss); unplanned host maintenance too; silent data corruption quarantines the
# host (node_loss); a software bug ends the process (sigkill); an NCCL watchdog timeout is a hang;
# a dependency failure (storage, scheduler) surfaces as an exception.
LLAMA3_TABLE5: dict[str, tuple[int, str]] = {
    "faulty GPU": (148, "node_loss"),
    "GPU HBM3 memory": (72, "node_loss"),
    "software bug": (54, "sigkill"),
    "network switch/cable": (35, "node_loss"),
    "host maintenance": (32, "node_loss"),
    "GPU SRAM memory": (19, "node_loss"),
    "GPU system processor": (17, "node_loss"),
    "NIC": (7, "node_loss"),
    "NCCL watchdog timeouts": (7, "hang"),
    "silent data corruption": (6, "node_loss"),
    "GPU thermal interface + sensor": (6, "node_loss"),
    "SSD": (3, "node_loss"),
    "power supply": (3, "node_loss"),
    "server chassis": (2, "node_loss"),
    "IO expansion board": (2, "node_loss"),
    "dependency": (2, "exception"),
    "CPU": (2, "node_loss"),
    "system memory": (2, "node_loss"),
}
LLAMA3_PER_NODE_DAY = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * LLAMA3_NODES)  # 3.79e-3
# Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning Research Clusters", HPCA 2025:
# about 5e-3 failures per GPU node-day across Meta's research clusters (shown beside Llama 3's rate).
KOKOLIS_PER_NODE_DAY = 5e-3
# The trainer's state per parameter: fp32 parameters plus AdamW's two fp32 moments (training/trainer.py
# builds torch.optim.AdamW over fp32 parameters).
TRAINER_BYTES_PER_PARAM = 12.0
# The AWS NVRx-on-EKS sample's published mean recovery per mode on 16 H100 (bench/peer.py
# PEER_PUBLISHED): in-process 10 s, ft_launcher 17 s, torchrun restart from checkpoint 270 s.
PEER_INPROCESS_S = 10.0
PEER_LAUNCHER_S = 17.0
PEER_JOB_RESTART_S = 270.0
# Node loss onto a warm spare: pod start on the spare, rendezvous, worker start. Assumed 90 s: the
# frontier figure is SageMaker HyperPod's peer restore in < 90 s at 2,304 GPUs (AWS's published figure).
NODE_SWAP_S = 90.0
# The rendezvous store's pod lost (the store Deployment's node drained, failed or the pod evicted): one
# store per job, so a rate per job, not per node. No public figure gives it. ASSUMED: Llama 3's rate of
# dependency failures for the whole job (Table 5: 2 in 54 days; storage and scheduler, services the job
# depends on as a whole as it depends on its store), 0.037 a day. `--set faults.store_loss_per_day=...`.
STORE_LOSS_PER_DAY = LLAMA3_TABLE5["dependency"][0] / LLAMA3_DAYS

Source = str


def fault_kind(cls: str) -> FaultKind:
    """What a fault class takes to recover (training/faults.py): soft ones stay in the process; a store
    loss restarts every pod (NVRx 0.7's launchers do not reconnect to the replacement store)."""
    if cls in SOFT_FAULTS:
        return "soft"
    if cls == "node_loss":
        return "node"
    if cls == "store_loss":
        return "store"
    return "process"


def llama3_mix() -> dict[str, float]:
    mix: dict[str, float] = {}
    for count, cls in LLAMA3_TABLE5.values():
        mix[cls] = mix.get(cls, 0.0) + count / LLAMA3_INTERRUPTIONS
    return mix


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Fleet(_Section):
    instance_profile: str = "p5.48xlarge"
    """A row of the one profile table (kitcore/profiles.py): GPUs per node."""
    nodes: int = Field(ge=1)
    """Training nodes (spares not counted)."""
    spares: int | None = Field(None, ge=0)
    """Warm spare nodes; None: the plan sizes them for `spare_target`."""
    spare_target: float = Field(0.99, gt=0, lt=1)
    """Chance the whole run never waits for capacity (a node loss finding no spare)."""
    repair_hours: float = Field(24.0, gt=0)
    """How long a failed node is out of the pool before it (or its replacement) is a spare again.
    Assumed: a day for diagnosis, repair or replacement capacity of a GPU host."""

    @field_validator("instance_profile")
    @classmethod
    def _known(cls, value: str) -> str:
        profile_for_field(value)
        return value

    @cached_property
    def profile(self) -> InstanceProfile:
        return get_profile(self.instance_profile)

    @property
    def gpus(self) -> int:
        return self.nodes * self.profile.workers_per_node


class Workload(_Section):
    step_s: float = Field(gt=0)
    """Mean time of one optimizer step (forward, backward, update)."""
    steps: int | None = Field(None, ge=1)
    """Run length in steps; or give `days` (wall time) instead."""
    days: float | None = Field(None, gt=0)
    model: str | None = None
    """A trainer preset (training/shapes.py) to size the state from; or give state_bytes."""
    state_bytes: float | None = Field(None, gt=0)
    """Checkpointed state of the whole job (all ranks), bytes."""
    bytes_per_param: float = Field(TRAINER_BYTES_PER_PARAM, gt=0)
    startup_s: float = Field(0.0, ge=0)
    """The job's first start (scheduling, image, process group, first load), paid once."""

    @field_validator("model")
    @classmethod
    def _preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            raise ValueError(f"unknown model preset {value!r}; use one of: {', '.join(PRESETS)}")
        return value

    @model_validator(mode="after")
    def _length(self) -> Self:
        if (self.steps is None) == (self.days is None):
            raise ValueError("give exactly one of steps (run length in steps) or days (wall time)")
        if self.model is None and self.state_bytes is None:
            raise ValueError("give model (a preset of training/shapes.py) or state_bytes")
        return self

    def total_state_bytes(self) -> float:
        if self.state_bytes is not None:
            return self.state_bytes
        assert self.model is not None  # noqa: S101 - validated
        return num_parameters(PRESETS[self.model]) * self.bytes_per_param


def num_parameters(shape: ModelShape) -> int:
    """Parameters of training/model.py's Decoder for `shape` (embeddings, blocks, norm, output)."""
    head = shape.dim // shape.num_heads
    attention = shape.dim * head * (2 * shape.num_heads + 2 * shape.num_kv_heads)
    ffn = 3 * shape.dim * shape.ffn_dim
    block = attention + ffn + 2 * shape.dim
    return 2 * shape.vocab_size * shape.dim + shape.num_layers * block + shape.dim


class Tier(_Section):
    """Costs of one checkpoint tier. Seconds are for the whole job: every rank writes its shard at once."""

    stall_s: float | None = Field(None, ge=0)
    """Loop time blocked per checkpoint when this tier takes its own snapshot (no memory tier in the
    mode). None: state per GPU / the GPU-to-host copy bandwidth. Disk tiers persisting from the memory
    snapshot add no stall."""
    write_s: float | None = Field(None, ge=0)
    """Background persist time of one checkpoint; None: derived from bandwidth_gbps."""
    bandwidth_gbps: float | None = Field(None, gt=0)
    """Write bandwidth, GB/s: per node for memory/local (each node writes its share), for the whole
    job for durable (the file system's throughput)."""
    restore_s: float = Field(0.0, ge=0)
    """Time to load a checkpoint from this tier on restart."""
    blocking: bool = False
    """The loop waits for the whole write (synchronous save, or an async save that waits for its
    predecessor -- the peer's case); then write_s counts as stall and the checkpoint commits at once."""


class Checkpoint(_Section):
    memory: Tier = Tier()
    local: Tier | None = None
    durable: Tier = Tier()
    copy_gbps: float | None = Field(None, gt=0)
    """GPU-to-host copy bandwidth per GPU: the memory snapshot's floor. None: the fleet's instance
    type's host link (kitcore/profiles.py: PCIe Gen4 on p5/p5e, Gen5 on p5en)."""
    peer_replica: bool = False
    """RAM snapshots also held by partner nodes: a lost node's shards come back from memory."""

    def tier(self, name: TierName) -> Tier | None:
        tier: Tier | None = getattr(self, name)
        return tier


Cadence = int | Literal["auto"]
OWN_WORKLOAD = ("step_s", "startup_s")
"""The `workload` fields a mode may set for itself (`ModeSetup`)."""
RecoveryField = Literal["inprocess_s", "launcher_s", "job_restart_s", "node_swap_s", "store_loss_s"]
"""A field of the plan's `recovery` section (`Recovery`), which a mode may set for itself."""


class ModeSetup(_Section):
    tiers: dict[TierName, Cadence]
    """Tiers this mode writes, each every N steps or `auto` (the plan recommends)."""
    step_s: float | None = Field(None, gt=0)
    """This mode's step when it is not workload.step_s: a measured run's own (its background
    checkpoint work shares the cores with the step), or a step the mode's replication slows."""
    startup_s: float | None = Field(None, ge=0)
    """This mode's first start when it is not workload.startup_s (a measured run's own start)."""
    recovery: dict[RecoveryField, Annotated[float, Field(ge=0)]] = {}
    """This mode's own recovery per layer where it is not the plan's `recovery` (a measured run's own:
    on shared cores the kit's background persists slow its restarts, so its in-process recovery is not
    another mode's)."""

    def own_workload(self) -> dict[str, float]:
        """The `workload` fields (OWN_WORKLOAD) this mode gives for itself."""
        own = {name: getattr(self, name) for name in OWN_WORKLOAD}
        return {name: value for name, value in own.items() if value is not None}

    @field_validator("tiers")
    @classmethod
    def _durable(cls, value: dict[str, Cadence]) -> dict[str, Cadence]:
        if "durable" not in value:
            raise ValueError("every mode needs the durable tier (the checkpoint a whole-job restart loads)")
        for name, every in value.items():
            if every != "auto" and every < 1:
                raise ValueError(f"{name}: a cadence is a number of steps >= 1, or auto")
        return value


def _default_modes() -> dict[Mode, ModeSetup]:
    # The peer's tiering for the three single-layer modes (one checkpoint cadence, durable), the kit's
    # tiering for its default (RAM, node-local disk, durable) -- the same split as bench/peer.py.
    one = ModeSetup(tiers={"durable": "auto"})
    return {
        "baseline": one,
        "inprocess": one,
        "ft_launcher": one,
        "both": ModeSetup(tiers={"memory": "auto", "local": "auto", "durable": "auto"}),
    }


class Recovery(_Section):
    """Seconds from a fault to training again, per layer (detection included, restore not)."""

    inprocess_s: float = Field(PEER_INPROCESS_S, ge=0)
    launcher_s: float = Field(PEER_LAUNCHER_S, ge=0)
    """ft_launcher restarts the workers (process death, and soft faults without in-process)."""
    job_restart_s: float = Field(PEER_JOB_RESTART_S, ge=0)
    """The whole job's workers restarted by torchrun or the Job controller (baseline)."""
    node_swap_s: float = Field(NODE_SWAP_S, ge=0)
    """A node loss taken over by a warm spare (then a launcher restart of the survivors)."""
    store_loss_s: float | None = Field(None, ge=0)
    """The rendezvous store's pod lost: every launcher fails, the Job restarts every pod on its node and
    they rendezvous on the Deployment's replacement. None: job_restart_s (the same whole-job restart)."""

    def store_restart_s(self) -> float:
        return self.job_restart_s if self.store_loss_s is None else self.store_loss_s


class Faults(_Section):
    count: int | None = Field(None, ge=0)
    """A fixed number of faults per run, spread over the steps (the benchmarks' way)."""
    per_node_day: float | None = Field(None, ge=0)
    """Or a rate: faults per training node per day (Llama 3: 3.8e-3; Kokolis et al.: ~5e-3)."""
    schedule: list[str] | None = None
    """Or the faults of one run, each CLASS@STEP (the trainer's `faults.plan` format): a run this kit
    measured replayed fault for fault (its steps decide the lost work, not their expectation)."""
    mix: dict[str, float] = Field(default_factory=llama3_mix)
    """Share of each fault class (training/faults.py names); default: Llama 3's Table 5 mapped."""
    store_loss_per_day: float | None = Field(None, ge=0)
    """With per_node_day: rendezvous store losses per day of the whole job (one store per job, so not a
    share of the per-node rate). None: STORE_LOSS_PER_DAY (assumed, see above). A count or schedule
    names store losses in its mix or schedule instead."""
    source: str = ""

    @field_validator("schedule")
    @classmethod
    def _items(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            parsed = parse_plan_item(item)
            if parsed is None or parsed[0] not in FAULT_CLASSES:
                raise ValueError(
                    f"{item!r} is not CLASS@STEP (e.g. exception@57) with CLASS one of "
                    f"{', '.join(FAULT_CLASSES)}"
                )
        return value

    def scheduled(self) -> list[tuple[str, int]]:
        """(class, step) of each scheduled fault, by step."""
        out = []
        for item in self.schedule or []:
            parsed = parse_plan_item(item)
            assert parsed is not None  # noqa: S101 - validated
            out.append(parsed[:2])
        return sorted(out, key=lambda f: f[1])

    @field_validator("mix")
    @classmethod
    def _classes(cls, value: dict[str, float]) -> dict[str, float]:
        for name, share in value.items():
            if name not in FAULT_CLASSES:
                raise ValueError(f"unknown fault class {name!r}; use one of: {', '.join(FAULT_CLASSES)}")
            if share < 0:
                raise ValueError(f"{name}: a share is >= 0")
        total = sum(value.values())
        if not value or total <= 0:
            raise ValueError("give at least one fault class with a share > 0")
        return {name: share / total for name, share in value.items()}

    @model_validator(mode="after")
    def _one(self) -> Self:
        given = [self.count is not None, self.per_node_day is not None, self.schedule is not None]
        if sum(given) != 1:
            raise ValueError(
                "give exactly one of count (faults per run), per_node_day (a rate) or schedule "
                "(a CLASS@STEP list)"
            )
        return self

    @model_validator(mode="after")
    def _store_rate(self) -> Self:
        if self.per_node_day is None and self.store_loss_per_day is not None:
            raise ValueError(
                "store_loss_per_day is a rate beside per_node_day; with a count or schedule, give store "
                "losses as store_loss in mix or schedule"
            )
        if self.per_node_day is not None and self.mix.get("store_loss"):
            raise ValueError(
                "mix: store_loss is a rate per job, not a share of the per-node rate: give "
                "faults.store_loss_per_day instead"
            )
        return self

    def store_losses_per_day(self) -> float:
        """A rate plan's store losses per day of the whole job (0 for a count or a schedule)."""
        if self.per_node_day is None:
            return 0.0
        return STORE_LOSS_PER_DAY if self.store_loss_per_day is None else self.store_loss_per_day

    def class_weights(self, nodes: int) -> dict[str, float]:
        """Each fault class's relative frequency on a fleet of `nodes`: the mix for a count or schedule;
        for a rate, faults per day (the per-node classes on every node, the store's once per job)."""
        if self.per_node_day is None:
            return dict(self.mix)
        weights = {name: share * self.per_node_day * nodes for name, share in self.mix.items()}
        weights["store_loss"] = self.store_losses_per_day()
        return weights

    def kind_shares(self) -> dict[FaultKind, float]:
        shares: dict[FaultKind, float] = {"soft": 0.0, "process": 0.0, "node": 0.0, "store": 0.0}
        for name, share in self.mix.items():
            shares[fault_kind(name)] += share
        return shares


# Replacement delays the shrink table weighs by default: a replacement that took a little longer than its
# pending limit, a slow one, and hardware AWS replaces within hours on fixed capacity.
SHRINK_DELAYS_S = (600.0, 3600.0, 14400.0)


class ShrinkSetup(_Section):
    """The job values' `shrink:` (k8s/sections.py Shrink) as the plan weighs it against waiting: a lost
    node that finds no spare, its replacement available only after a delay."""

    min_nodes: int | None = Field(None, ge=1)
    """The fewest nodes the job trains on (the values' shrink.min_nodes); None: no shrink table."""
    pending_limit_s: float = Field(Shrink.model_fields["pending_limit_s"].default, gt=0)
    """How long the restart round waits for the replacement before the job shrinks (the values')."""
    parallel: ParallelConfig = ParallelConfig()
    """The job's parallel layout (the values' trainer.parallel): the node counts it can shrink to."""
    delays_s: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=lambda: list(SHRINK_DELAYS_S), min_length=1
    )
    """Replacement delays to tabulate: seconds from a node's loss until its replacement can join."""

    def node_counts(self, nodes: int, ranks_per_node: int) -> list[int]:
        """The smaller sizes the layout runs at, largest first, down to min_nodes (as the chart derives
        the ranks' shrink.node_counts, k8s/rank_config.py)."""
        if self.min_nodes is None:
            return []
        return self.parallel.node_counts(nodes, ranks_per_node, down_to=self.min_nodes)


# The plan's name is the folder of its plots, runs/plan-<name>: one file system name (at most 255
# bytes, the Linux NAME_MAX) with room for the prefix, and no path separator.
PLAN_NAME_MAX = 200


class Plan(_Section):
    name: str = "plan"
    """Names the plan in the report and its plot folder runs/plan-<name>."""
    fleet: Fleet
    workload: Workload
    checkpoint: Checkpoint = Checkpoint()
    recovery: Recovery = Recovery()
    faults: Faults
    modes: dict[Mode, ModeSetup] = Field(default_factory=_default_modes)
    """Modes to project and the tiers each writes (default: all four; at least one)."""
    max_interval_s: float = Field(3600.0, gt=0)
    """The longest interval recommended for a tier no fault restores from (the checkpoint an operator's
    restart or a fault storm falls back to)."""
    shrink: ShrinkSetup = ShrinkSetup()
    """Shrink instead of waiting for a lost node's replacement: set min_nodes for the table that weighs it."""

    @field_validator("name")
    @classmethod
    def _folder_name(cls, value: str) -> str:
        if not value or "/" in value or "\0" in value or value in {".", ".."}:
            raise ValueError(f"{value!r} names the plot folder runs/plan-<name>: use no '/', e.g. my-plan")
        if len(value.encode()) > PLAN_NAME_MAX:
            raise ValueError(
                f"{len(value.encode())} bytes is too long for the plot folder runs/plan-<name> (a file "
                f"system name holds 255 bytes); shorten it to at most {PLAN_NAME_MAX}"
            )
        return value

    @field_validator("modes", mode="before")
    @classmethod
    def _renamed_mode(cls, value: object) -> object:
        if isinstance(value, dict) and RENAMED_MODE in value:
            if "both" in value:
                raise ValueError(f"names both and {RENAMED_MODE}, the same mode: keep both")
            warnings.warn(
                f"modes.{RENAMED_MODE} is now modes.both, the job values' name for the mode; {RENAMED_MODE} "
                "is read as both for now: rename it in the plan file (and in --set modes.* overrides)",
                StaleInput,
                stacklevel=2,
            )
            value = {("both" if name == RENAMED_MODE else name): setup for name, setup in value.items()}
        return value

    @field_validator("modes")
    @classmethod
    def _some_mode(cls, value: dict[Mode, ModeSetup]) -> dict[Mode, ModeSetup]:
        if not value:
            raise ValueError(
                f"lists no mode; name at least one of {', '.join(MODES)}, or leave modes out for all four"
            )
        return value

    @model_validator(mode="after")
    def _length_for_counts(self) -> Self:
        if self.faults.per_node_day is None and self.workload.steps is None:
            raise ValueError("faults: a count or schedule of faults per run needs workload.steps, not days")
        last = max((step for _, step in self.faults.scheduled()), default=0)
        if self.workload.steps is not None and last > self.workload.steps:
            raise ValueError(f"faults.schedule: step {last} is beyond workload.steps ({self.workload.steps})")
        return self

    @model_validator(mode="after")
    def _tiers_defined(self) -> Self:
        for mode, setup in self.modes.items():
            if "local" in setup.tiers and self.checkpoint.local is None:
                raise ValueError(f"modes.{mode}: uses the local tier but checkpoint.local is not set")
        return self

    @model_validator(mode="after")
    def _costs_known(self) -> Self:
        for name in ("local", "durable"):
            tier = self.checkpoint.tier(name)
            if tier is not None and tier.write_s is None and tier.bandwidth_gbps is None:
                raise ValueError(f"checkpoint.{name}: give write_s or bandwidth_gbps")
        return self

    @model_validator(mode="after")
    def _shrink_can_run(self) -> Self:
        minimum = self.shrink.min_nodes
        if minimum is None:
            return self
        nodes = self.fleet.nodes
        if minimum >= nodes:
            raise ValueError(
                f"shrink.min_nodes ({minimum}) must be below fleet.nodes ({nodes}): it is the fewest nodes "
                "the job trains on after a loss; lower it, or unset it"
            )
        # The job restarts at another size through ft_launcher's rendezvous (k8s/values.py says the same).
        if not any(layers(mode).launcher == "ft_launcher" for mode in self.modes):
            raise ValueError(
                f"shrink.min_nodes is set but none of the plan's modes ({', '.join(self.modes)}) runs "
                "ft_launcher, which restarts the job at another size: add ft_launcher or both, or unset it"
            )
        problem = self.shrink.parallel.shrink_problem(
            "shrink.parallel.mesh",
            min_nodes=minimum,
            nodes=nodes,
            ranks_per_node=self.fleet.profile.workers_per_node,
        )
        if problem is not None:
            raise ValueError(problem)
        return self

    # ---- derived figures ----------------------------------------------------------------------------
    @property
    def state_per_gpu(self) -> float:
        return self.workload.total_state_bytes() / self.fleet.gpus

    def for_mode(self, mode: Mode) -> Plan:
        """This plan as `mode` runs it: the mode's own step, first start and recoveries where it gives
        them."""
        setup = self.modes.get(mode)
        if setup is None:
            return self
        workload = setup.own_workload()
        update: dict[str, BaseModel] = {}
        if workload:
            update["workload"] = self.workload.model_copy(update=workload)
        if setup.recovery:
            recovery: dict[str, float] = dict(setup.recovery.items())
            update["recovery"] = self.recovery.model_copy(update=recovery)
        return self.model_copy(update=update) if update else self

    def stall_s(self, name: TierName) -> float:
        """Loop time per checkpoint when `name` takes its own snapshot."""
        tier = self.checkpoint.tier(name)
        assert tier is not None  # noqa: S101
        if tier.blocking:
            return self.write_s(name)
        if tier.stall_s is not None:
            return tier.stall_s
        gbps = self.copy_gbps
        return 0.0 if gbps is None else self.state_per_gpu / (gbps * 1e9)

    def write_s(self, name: TierName) -> float:
        """Background persist time of one checkpoint of tier `name` (0 for memory: the copy is it)."""
        tier = self.checkpoint.tier(name)
        assert tier is not None  # noqa: S101
        if tier.write_s is not None:
            return tier.write_s
        if tier.bandwidth_gbps is None:
            return 0.0
        per_writer = self.workload.total_state_bytes()
        if name != "durable":
            per_writer /= self.fleet.nodes
        return per_writer / (tier.bandwidth_gbps * 1e9)

    def fault_rate(self) -> float | None:
        """Faults per wall-clock second for the whole job, store losses included (None for a fixed
        count or a schedule)."""
        if self.faults.per_node_day is None:
            return None
        return sum(self.faults.class_weights(self.fleet.nodes).values()) / SECONDS_PER_DAY

    @property
    def copy_gbps(self) -> float | None:
        """GPU-to-host copy bandwidth per GPU: the plan's own, else the instance type's host link; None
        where ranks hold their state in host memory already (no GPU: nothing to copy over a link)."""
        if self.checkpoint.copy_gbps is not None:
            return self.checkpoint.copy_gbps
        link = self.fleet.profile.host_link
        return None if link is None else link.gbps

    @property
    def useful_s(self) -> float | None:
        return None if self.workload.steps is None else self.workload.steps * self.workload.step_s


def poisson_tail(mean: float, k: int) -> float:
    """P(X >= k) for X ~ Poisson(mean): scipy's survival function, exact in the far tail (where one minus
    a summed CDF keeps no digit) and in constant time for a fleet's mean of thousands of nodes out."""
    if k <= 0:
        return 1.0
    return float(poisson.sf(k - 1, mean))


def poisson_fewest(mean: float, tail_at_most: float) -> float:
    """The smallest k with P(X >= k) <= `tail_at_most` for X ~ Poisson(mean) (scipy's inverse survival
    function); inf where no count reaches it (an infinite mean, or a bound of 0)."""
    if tail_at_most >= 1.0:
        return 0
    if tail_at_most <= 0.0 or not math.isfinite(mean):
        return math.inf
    return float(poisson.isf(tail_at_most, mean)) + 1
