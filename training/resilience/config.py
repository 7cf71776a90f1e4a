"""The resilience layers' typed configuration: what any training script run under the kit is given.

`ResilienceConfig` is the part of a job's configuration the kit owns, whatever the script: the mode
(which NVRx layers wrap the loop: training/resilience/modes.py), the run folder, the process group's
timeout, the checkpoint tiers, the in-process restart and ft_launcher settings, the fault schedule and
the metrics. The public API (training/api.py) reads it from the `NVRX_EKS_CONFIG` variable the chart
sets (a JSON object) or takes it from the caller; every script, the reference trainer included, keeps
its own settings on its own command line. Torch-free: the charts validate it when they render a job.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nvrx_eks.kitcore.configio import UserError, load_model
from nvrx_eks.training.checkpoint.config import CheckpointConfig
from nvrx_eks.training.resilience.modes import FAULT_CLASSES, HARNESS_ONLY, FaultClass, Mode, layers
from nvrx_eks.training.resilience.shrink import ShrinkConfig

if TYPE_CHECKING:
    from collections.abc import Mapping

CONFIG_ENV = "NVRX_EKS_CONFIG"
"""A script's `ResilienceConfig` as one JSON object: the chart renders it from the job values'
`trainer` tree over the fields it owns (k8s/rank_config.py `resilience_env`)."""
RUN_ID_ENV = "NVRX_EKS_RUN_ID"
"""The run's identity, the same in every rank and restart of one run (training/run_scope.py): the chart
sets the Job's UID; the kit's launcher draws one when nothing set it."""

RENDEZVOUS_ENV = "NVRX_EKS_RENDEZVOUS"
"""`HOST:PORT/RUN_ID`: the job's rendezvous store and run, which the kit's launcher hands its workers so
that a shrunk job's ranks can report their durable checkpoints to the control process
(training/resilience/launcher_liveness.py `DurableReport`)."""

PLAN_ITEM = re.compile(r"^(?P<cls>[a-z_]+)@(?P<step>\d+)(?::(?P<rank>\d+))?$")
"""One planned fault, CLASS@STEP[:RANK] (rank 0 when left out): the grammar of `faults.plan`."""


def parse_plan_item(item: str) -> tuple[str, int, int] | None:
    """(class, step, rank) of one `faults.plan` item, or None when it is not CLASS@STEP[:RANK]. The class
    is not checked here: `FaultsConfig` refuses an unknown one, the planner names it in its own words."""
    match = PLAN_ITEM.match(item)
    if match is None:
        return None
    return match["cls"], int(match["step"]), int(match["rank"] or 0)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DistConfig(_Section):
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="auto: CUDA + NCCL + FSDP2 when a GPU is visible, else CPU + gloo (flat all-reduce).",
    )
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="Process-group (collective) timeout; default 1.5 s in inprocess/both modes, else 60 s. "
        "On CPU it is how the peers of a hung rank notice it, and in inprocess/both modes it must be below "
        "inprocess.soft_timeout_s: the loop waits for its collectives from Python, where an in-process "
        "restart ends the wait, but a blocking gloo collective cannot be aborted. Too short for the "
        "machine's scheduling noise, and a slow rank trips a restart.",
    )


class InProcessConfig(_Section):
    """nvidia_resiliency_ext.inprocess.Wrapper settings (used in modes inprocess and both)."""

    store_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Port of the wrapper's own TCPStore (hosted by rank 0); default: a free port rank 0 "
        "picks each launcher round and shares through the process-group store.",
    )
    soft_timeout_s: float = Field(
        3.0, gt=0, description="No ping for this long: abort and restart in process."
    )
    hard_timeout_s: float = Field(
        12.0, gt=0, description="No ping for this long: the wrapper's monitor process kills the rank."
    )
    heartbeat_timeout_s: float = Field(6.0, gt=0, description="A rank silent this long counts as missing.")
    barrier_timeout_s: float = Field(30.0, gt=0, description="Restart barrier timeout.")
    completion_timeout_s: float = Field(30.0, gt=0, description="Completion barrier timeout.")
    interval_s: float = Field(0.5, gt=0, description="Monitor thread/process and watchdog interval.")
    last_call_wait_s: float = Field(
        0.05,
        ge=0,
        description="After the first fault is recorded, wait this long for other ranks to report theirs "
        "before aborting. NVRx's default (1 s) is paid on every soft fault; concurrent reports still land "
        "in the store for attribution after the abort.",
    )
    max_iterations: int = Field(
        20, ge=1, description="In-process restart budget; keep it below the launcher's --max-restarts."
    )
    max_rank_faults: int = Field(
        10, ge=1, description="FaultCounter health check: faults one rank may cause."
    )

    @model_validator(mode="after")
    def _ordered(self) -> InProcessConfig:
        # The Wrapper's own checks (wrap.py), stated here so a bad value is a field error, not a traceback.
        if not self.soft_timeout_s < self.hard_timeout_s < self.barrier_timeout_s:
            raise ValueError("need soft_timeout_s < hard_timeout_s < barrier_timeout_s")
        if not self.interval_s < min(self.soft_timeout_s, self.heartbeat_timeout_s):
            raise ValueError("interval_s must be below soft_timeout_s and heartbeat_timeout_s")
        if not self.heartbeat_timeout_s < self.barrier_timeout_s:
            raise ValueError("heartbeat_timeout_s must be below barrier_timeout_s")
        if not self.last_call_wait_s < self.soft_timeout_s:
            raise ValueError("last_call_wait_s must be below soft_timeout_s")
        return self


class FtConfig(_Section):
    """ft_launcher integration through RankMonitorClient heartbeats (modes ft_launcher and both)."""

    calc_timeouts_after: int = Field(
        5, ge=1, description="Steps after which heartbeat timeouts are calculated from observed intervals."
    )
    heartbeat_timeout_floor_s: float = Field(
        8.0,
        gt=0,
        description="Floor for the calculated between-heartbeat timeout (a tiny model's steps are ms).",
    )
    initial_timeout_floor_s: float = Field(
        60.0,
        gt=0,
        description="Floor for the calculated first-heartbeat timeout (startup + checkpoint load).",
    )


class FaultsConfig(_Section):
    """Deterministic fault schedule: an explicit plan, and/or `count` faults drawn from `seed`."""

    plan: list[str] = Field(
        default_factory=list,
        description="Explicit faults CLASS@STEP[:RANK], comma separated, e.g. exception@5:1,sigkill@12:2. "
        f"Classes: {', '.join(FAULT_CLASSES)}.",
    )
    count: int = Field(0, ge=0, description="Number of faults to draw.")
    seed: int | None = Field(None, description="Seed of the draw (default: the run's seed).")
    weights: dict[FaultClass, float] = Field(
        # store_loss needs a harness that can delete the store's pod (the local executor); a training
        # rank has no Kubernetes API access, so it is planned explicitly and never drawn by default.
        default_factory=lambda: {c: 0.0 if c in HARNESS_ONLY else 1.0 for c in FAULT_CLASSES},
        description="Relative weight per class for the draw, e.g. {exception: 0.6, hang: 0.4}.",
    )
    first_step: int = Field(2, ge=1, description="First step a drawn fault may hit.")
    last_step: int | None = Field(None, description="Last step a drawn fault may hit (default: steps - 1).")
    target_rank: int | None = Field(None, ge=0, description="Rank every drawn fault hits (default: drawn).")
    min_gap: int = Field(3, ge=1, description="Minimum steps between two drawn faults.")
    node_loss_grace_s: float = Field(
        30.0,
        gt=0,
        description="Node loss: wait this long for the harness to kill the node, then kill the agent.",
    )

    @field_validator("plan", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:  # noqa: ANN401
        if isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        return value

    @field_validator("plan")
    @classmethod
    def _check_plan(cls, value: list[str]) -> list[str]:
        for item in value:
            parsed = parse_plan_item(item)
            if parsed is None or parsed[0] not in FAULT_CLASSES:
                raise ValueError(
                    f"{item!r} is not CLASS@STEP[:RANK] with CLASS one of {', '.join(FAULT_CLASSES)}"
                )
        return value

    @field_validator("weights")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        if any(w < 0 for w in value.values()) or not any(w > 0 for w in value.values()):
            raise ValueError("weights must be >= 0 with at least one > 0")
        # The draw walks the classes in order: one order, whatever order the mapping was written in
        # (the job values' YAML, the chart's flags, a script's JSON), so every reader draws the same.
        return dict(sorted(value.items()))

    def ranks_problem(self, world_size: int) -> str | None:
        """The ranks a fault targets exist only once the world size is known: the chart checks them
        against the job's, the fault schedule against the run's."""
        for item in self.plan:
            parsed = parse_plan_item(item)
            assert parsed is not None  # noqa: S101 - checked by _check_plan
            rank = parsed[2]
            if rank >= world_size:
                return (
                    f"faults.plan: {item!r} targets rank {rank}, but the job has ranks 0..{world_size - 1}; "
                    "pick a rank below the world size"
                )
        if self.target_rank is not None and self.target_rank >= world_size:
            return (
                f"faults.target_rank ({self.target_rank}) is not a rank of this job (0..{world_size - 1}); "
                "pick a rank below the world size"
            )
        return None


MESH_DIM = re.compile(r"^[a-z][a-z0-9_]{0,15}$")


class ParallelConfig(_Section):
    """The parallel layout a script builds its model on: `attempt.device_mesh()` with no argument."""

    mesh: dict[str, int] = Field(
        default_factory=lambda: {"dp": -1},
        description="Device-mesh dimensions, outermost first: name -> size, one size -1 for the ranks "
        "left (e.g. {dp: -1, tp: 8}: tensor parallelism within an 8-GPU node, data parallelism across "
        "nodes). The sizes' product must equal the job's world size; checkpoints reshard to any other.",
    )

    @field_validator("mesh")
    @classmethod
    def _dims(cls, value: dict[str, int]) -> dict[str, int]:
        if not value:
            raise ValueError("name at least one dimension, e.g. {dp: -1}")
        for name, size in value.items():
            if not MESH_DIM.match(name):
                raise ValueError(
                    f"{name!r}: a dimension name is lowercase letters, digits and _, e.g. dp, tp"
                )
            if size == 0 or size < -1:
                raise ValueError(f"{name}: {size}; a size is a positive count of ranks, or -1 for the rest")
        if sum(1 for size in value.values() if size == -1) > 1:
            raise ValueError("at most one dimension may be -1 (the ranks left over)")
        return value

    def shape(self, world_size: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(names, sizes) of the mesh at `world_size` ranks; ValueError naming both when it cannot be."""
        fixed = 1
        for size in self.mesh.values():
            fixed *= max(size, 1)
        spec = ", ".join(f"{name}={size}" for name, size in self.mesh.items())
        if world_size % fixed:
            raise ValueError(
                f"mesh {{{spec}}} needs a multiple of {fixed} ranks, this job has {world_size}: "
                "change parallel.mesh (or the job's nodes) so the fixed sizes divide the world size"
            )
        rest = world_size // fixed
        if rest != 1 and -1 not in self.mesh.values():
            raise ValueError(
                f"mesh {{{spec}}} covers {fixed} ranks, this job has {world_size}: make one size -1 (the "
                "ranks left) or the product equal to the world size"
            )
        sizes = tuple(rest if size == -1 else size for size in self.mesh.values())
        return tuple(self.mesh), sizes

    def node_counts(self, nodes: int, ranks_per_node: int, *, down_to: int) -> list[int]:
        """The node counts from `nodes - 1` down to `down_to` that this layout runs at, largest first: the
        world size fits the mesh, and the dimensions inside the one of size -1 (the ranks left, data
        parallelism) stay within a node, so no tensor-parallel group spans the place of a lost node."""
        sizes = list(self.mesh.values())
        inner = 1
        if -1 in sizes:
            for size in sizes[sizes.index(-1) + 1 :]:
                inner *= size
        if -1 not in sizes or ranks_per_node % inner:
            return []
        counts = []
        for count in range(nodes - 1, down_to - 1, -1):
            try:
                self.shape(count * ranks_per_node)
            except ValueError:
                continue
            counts.append(count)
        return counts

    def shrink_problem(self, field: str, *, min_nodes: int, nodes: int, ranks_per_node: int) -> str | None:
        """Why a job of `nodes` nodes cannot shrink to `min_nodes` with this layout (`field` names the mesh
        in the caller's file), or None. The job values and the planner say it alike."""
        counts = self.node_counts(nodes, ranks_per_node, down_to=min_nodes)
        if min_nodes in counts:
            return None
        mesh = ", ".join(f"{k}: {v}" for k, v in self.mesh.items())
        runs_at = ", ".join(map(str, counts)) or "no smaller count"
        return (
            f"shrink.min_nodes ({min_nodes}): {field} {{{mesh}}} cannot run on {min_nodes} node(s) of "
            f"{ranks_per_node} ranks (it runs at {runs_at} between {min_nodes} and {nodes - 1}): give the "
            "mesh one size -1 (data parallelism) with the sizes inside it dividing a node's ranks, or pick "
            "a min_nodes it runs at"
        )


class MetricsConfig(_Section):
    prometheus_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve /metrics on this port + local rank (default: textfile only).",
    )
    textfile_every: int = Field(10, ge=1, description="Steps between Prometheus textfile writes.")


class ResilienceConfig(_Section):
    """What the kit needs to run one training process resiliently, whatever the training script."""

    mode: Mode = Field(
        "baseline",
        description="Resilience layers around the loop: baseline, inprocess, ft_launcher or both "
        "(training/resilience/modes.py).",
    )
    seed: int = Field(0, description="Seed of the fault draw (faults.seed overrides it).")
    run_dir: Path = Field(
        Path("runs/train"), description="Folder for events, metrics and default checkpoints."
    )
    dist: DistConfig = DistConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    inprocess: InProcessConfig = InProcessConfig()
    ft: FtConfig = FtConfig()
    faults: FaultsConfig = FaultsConfig()
    metrics: MetricsConfig = MetricsConfig()
    parallel: ParallelConfig = ParallelConfig()
    shrink: ShrinkConfig = ShrinkConfig()

    @model_validator(mode="after")
    def _layers_agree(self) -> ResilienceConfig:
        spec = layers(self.mode)
        timeout = self.collective_timeout_s
        if spec.inprocess and self.dist.device != "cuda" and timeout >= self.inprocess.soft_timeout_s:
            raise ValueError(
                f"dist.timeout_s ({timeout}) must be below inprocess.soft_timeout_s "
                f"({self.inprocess.soft_timeout_s}) on CPU: gloo collectives cannot be aborted"
            )
        if spec.inprocess and spec.heartbeats:
            # Python-visible hangs belong to the in-process layer, deadlocks below Python to ft_launcher:
            # a rank recovering in process must never go silent for the heartbeat timeout, which must
            # fire before the wrapper's hard timeout kills the rank on its own.
            silence = self.inprocess_recovery_silence_s
            if not silence < self.ft.heartbeat_timeout_floor_s < self.inprocess.hard_timeout_s:
                raise ValueError(
                    "need inprocess.soft_timeout_s + inprocess.interval_s < "
                    f"ft.heartbeat_timeout_floor_s < inprocess.hard_timeout_s (now {silence:g} < "
                    f"{self.ft.heartbeat_timeout_floor_s:g} < {self.inprocess.hard_timeout_s:g})"
                )
        check_fault_plan(self.faults, steps=None)
        return self

    @property
    def inprocess_recovery_silence_s(self) -> float:
        """The longest a rank recovering in process goes without an ft_launcher heartbeat (a mode with
        both layers): from its last step until its restart is decided, at most the soft timeout,
        noticed within one monitor interval.

        From the moment a restart is decided until the rank's next step, the in-process layer beats for
        the rank every monitor interval (training/resilience/layers.py), however long the recovery
        takes (a peer blocked in a gloo collective that cannot be aborted, a loaded machine). The
        launcher's heartbeat timeout must exceed this silence, or it kills ranks the in-process layer
        is restarting; the lower it is, the sooner a deadlock below Python is ended."""
        return self.inprocess.soft_timeout_s + self.inprocess.interval_s

    @property
    def collective_timeout_s(self) -> float:
        if self.dist.timeout_s is not None:
            return self.dist.timeout_s
        # gloo collectives cannot be aborted, so an in-process restart waits for the timeout: keep it short.
        return 1.5 if layers(self.mode).inprocess else 60.0

    def for_this_world(self, env: Mapping[str, str] | None = None) -> ResilienceConfig:
        """The configuration a rank runs with in this process's world (the launcher's WORLD_SIZE over
        LOCAL_WORLD_SIZE nodes): as given, except in a job that shrank below its full size, where the
        peer replicas are capped at the partner nodes left (none on one node) until it grows back."""
        env = os.environ if env is None else env
        replicas = self.checkpoint.peer_replicas
        try:
            nodes = int(env.get("WORLD_SIZE", "1")) // max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            return self  # the runtime input check names the variable
        if not self.shrink.enabled or nodes >= self.shrink.nodes or replicas < nodes:
            return self
        checkpoint = self.checkpoint.model_copy(update={"peer_replicas": max(0, nodes - 1)})
        return self.model_copy(update={"checkpoint": checkpoint})

    def effective_checkpoint(self) -> CheckpointConfig:
        """The checkpoint section with run-scoped defaults: durable tier under the run dir unless set,
        and the memory tier in a folder of this run (so two runs on one host never share snapshots)."""
        update: dict[str, Any] = {}
        if self.checkpoint.durable_dir is None:
            update["durable_dir"] = str(self.run_dir.resolve() / "checkpoints")
        default_memory = CheckpointConfig.model_fields["memory_dir"].default
        if self.checkpoint.memory_dir == default_memory:
            digest = hashlib.sha256(str(self.run_dir.resolve()).encode()).hexdigest()[:12]
            update["memory_dir"] = default_memory / digest
        return self.checkpoint.model_copy(update=update)


MAPPING_FIELDS = frozenset({("faults", "weights"), ("parallel", "mesh")})
"""Fields whose value is a mapping, not a section: one leaf each."""


def config_leaves(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(path, value) for every leaf of a configuration tree, sections walked, mapping fields whole: the
    `key=value` overrides `resilience_config` validates a document as."""
    leaves: list[tuple[tuple[str, ...], Any]] = []
    for key, value in tree.items():
        path = (*prefix, str(key))
        if isinstance(value, dict) and path not in MAPPING_FIELDS:
            leaves += config_leaves(value, path)
        else:
            leaves.append((path, value))
    return leaves


def config_document(config: BaseModel) -> dict[str, Any]:
    """The fields `config` was given (the job values' and the chart's), as JSON types: what the chart
    hands a rank, whose own defaults fill in the rest. `resilience_config` reads it back to the same
    configuration."""
    return config.model_dump(mode="json", exclude_unset=True)


def config_env_value(config: ResilienceConfig) -> str:
    """`NVRX_EKS_CONFIG` for a script's ranks: `config_document` as one JSON object."""
    return json.dumps(config_document(config), sort_keys=True, separators=(",", ":"))


def resilience_config(document: dict[str, Any], *, source: str) -> ResilienceConfig:
    """A `ResilienceConfig` from a tree (the chart's JSON document), every bad field in one UserError."""
    overrides = [f"{'.'.join(path)}={json.dumps(value)}" for path, value in config_leaves(document)]
    return load_model(ResilienceConfig, None, overrides, source=source)


def config_from_env(env: Mapping[str, str] | None = None) -> ResilienceConfig:
    """The job's configuration from `NVRX_EKS_CONFIG` in `env` (default: this process's), as the chart
    set it; the defaults where it is unset."""
    raw = (os.environ if env is None else env).get(CONFIG_ENV)
    return config_from_json(raw, source=CONFIG_ENV) if raw else ResilienceConfig()


def config_from_json(text: str, *, source: str) -> ResilienceConfig:
    """A `ResilienceConfig` from its JSON text (`NVRX_EKS_CONFIG`, the self-check's --config): one
    UserError for text that is no JSON object, or for every bad field."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{source} is not a JSON object ({exc}); the chart renders it from the job values"
        ) from None
    if not isinstance(document, dict):
        raise UserError(f"{source} is not a JSON object; the chart renders it from the job values")
    return resilience_config(document, source=source)


def check_fault_plan(faults: FaultsConfig, *, steps: int | None) -> None:
    """A fault the run never reaches (or one hidden by another) would be dropped without a word: raise
    ValueError naming it. `steps` None: the run's length is not known yet (a user's script gives it to
    `Attempt.steps`, which checks again)."""
    seen: dict[tuple[int, int], str] = {}
    for item in faults.plan:
        parsed = parse_plan_item(item)
        assert parsed is not None  # noqa: S101 - checked by FaultsConfig
        _, step, rank = parsed
        if steps is not None and step >= steps:
            raise ValueError(
                f"faults.plan: {item!r} is at step {step}, but the run's steps are 0..{steps - 1}; "
                f"move it below {steps} or raise steps"
            )
        if (step, rank) in seen:
            raise ValueError(
                f"faults.plan: {item!r} and {seen[step, rank]!r} hit rank {rank} at the same step; "
                "a rank fires one fault per step: move one of them"
            )
        seen[step, rank] = item
    if steps is None:
        return
    if faults.last_step is not None and faults.last_step >= steps:
        raise ValueError(
            f"faults.last_step ({faults.last_step}) is past the run's last step ({steps - 1}); "
            "lower it or raise steps"
        )
    last = faults.last_step if faults.last_step is not None else steps - 1
    if faults.count and last - faults.first_step + 1 < faults.count * faults.min_gap:
        raise ValueError(
            f"faults: {faults.count} faults with min_gap {faults.min_gap} do not fit in steps "
            f"{faults.first_step}..{last}; lower faults.count or raise steps"
        )
