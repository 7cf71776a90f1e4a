"""The trainer's typed configuration and command line.

`python -m training [--config FILE] [--FLAG VALUE ...]`: every field of `TrainConfig` (nested
sections included) is a flag, generated from the model so the two never drift: `--steps`,
`--run-dir`, `--inprocess-soft-timeout-s`, `--faults-plan`, ... `--help` lists each with its
description and default. A YAML file gives the same fields as a tree; flags override it. Bad input is
one message naming the field and the fix (kitcore.configio.UserError -> exit 2).
"""

from __future__ import annotations

import argparse
import hashlib
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kitcore.configio import UserError, load_model
from training.checkpoint.config import CheckpointConfig
from training.shapes import PRESETS

Mode = Literal["baseline", "inprocess", "ft_launcher", "both"]
FaultClass = Literal[
    "exception", "hang", "skip_collective", "sigkill", "oom", "deadlock", "node_loss", "store_loss"
]
FAULT_CLASSES: tuple[str, ...] = get_args(FaultClass)
HARNESS_ONLY = frozenset({"store_loss"})
"""Classes only a harness can fire: the rendezvous store's pod is not a training pod's to delete."""
_PLAN_ITEM = re.compile(r"^(?P<cls>[a-z_]+)@(?P<step>\d+)(?::(?P<rank>\d+))?$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataConfig(_Section):
    batch_size: int = Field(4, ge=1, description="Sequences per rank per step.")
    token_file: Path | None = Field(
        None, description="uint16 token file (memory-mapped); default: synthetic tokens keyed by seed."
    )


class OptimConfig(_Section):
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, ge=0, description="Gradient norm clip (0 disables).")


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
            match = _PLAN_ITEM.match(item)
            if not match or match["cls"] not in FAULT_CLASSES:
                raise ValueError(
                    f"{item!r} is not CLASS@STEP[:RANK] with CLASS one of {', '.join(FAULT_CLASSES)}"
                )
        return value

    @field_validator("weights")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        if any(w < 0 for w in value.values()) or not any(w > 0 for w in value.values()):
            raise ValueError("weights must be >= 0 with at least one > 0")
        return value


class MetricsConfig(_Section):
    prometheus_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve /metrics on this port + local rank (default: textfile only).",
    )
    textfile_every: int = Field(10, ge=1, description="Steps between Prometheus textfile writes.")


class TrainConfig(_Section):
    mode: Mode = Field(
        "baseline", description="Resilience layers around the loop: baseline, inprocess, ft_launcher or both."
    )
    model: str = Field("tiny", description=f"Model preset: {', '.join(PRESETS)}.")
    steps: int = Field(50, ge=1, description="Optimizer steps to train.")
    seed: int = Field(0, description="Seed for weights, data and the fault draw.")
    run_dir: Path = Field(
        Path("runs/train"), description="Folder for events, metrics and default checkpoints."
    )
    log_every: int = Field(10, ge=1, description="Steps between progress lines on rank 0.")
    emulated_device_step_s: float = Field(
        0.0,
        ge=0,
        description="Scale model of an accelerator step: after backward the host waits this long without "
        "holding a core, as it waits on CUDA streams. 0 (default) trains at CPU speed; benchmarks set it "
        "so that fixed costs (start-up, recovery) weigh what they weigh against a GPU step.",
    )
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    dist: DistConfig = DistConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    inprocess: InProcessConfig = InProcessConfig()
    ft: FtConfig = FtConfig()
    faults: FaultsConfig = FaultsConfig()
    metrics: MetricsConfig = MetricsConfig()

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in PRESETS:
            raise ValueError(f"unknown preset {value!r}; choose one of {', '.join(PRESETS)}")
        return value

    @model_validator(mode="after")
    def _layers_agree(self) -> TrainConfig:
        uses_inprocess = self.mode in {"inprocess", "both"}
        timeout = self.collective_timeout_s
        if uses_inprocess and self.dist.device != "cuda" and timeout >= self.inprocess.soft_timeout_s:
            raise ValueError(
                f"dist.timeout_s ({timeout}) must be below inprocess.soft_timeout_s "
                f"({self.inprocess.soft_timeout_s}) on CPU: gloo collectives cannot be aborted"
            )
        if self.mode == "both":
            # Python-visible hangs belong to the in-process layer, deadlocks below Python to ft_launcher:
            # a rank recovering in process must never go silent for the heartbeat timeout, which must
            # fire before the wrapper's hard timeout kills the rank on its own.
            silence = self.inprocess_recovery_silence_s
            if not silence < self.ft.heartbeat_timeout_floor_s < self.inprocess.hard_timeout_s:
                raise ValueError(
                    "need max(inprocess.soft_timeout_s, dist.timeout_s) + inprocess.interval_s < "
                    f"ft.heartbeat_timeout_floor_s < inprocess.hard_timeout_s (now {silence:g} < "
                    f"{self.ft.heartbeat_timeout_floor_s:g} < {self.inprocess.hard_timeout_s:g})"
                )
        self._check_fault_steps()
        last = self.faults.last_step if self.faults.last_step is not None else self.steps - 1
        if self.faults.count and last - self.faults.first_step + 1 < self.faults.count * self.faults.min_gap:
            raise ValueError(
                f"faults: {self.faults.count} faults with min_gap {self.faults.min_gap} do not fit in steps "
                f"{self.faults.first_step}..{last}; lower faults.count or raise steps"
            )
        return self

    def _check_fault_steps(self) -> None:
        """A fault the run never reaches (or one hidden by another) would be dropped without a word."""
        seen: dict[tuple[int, int], str] = {}
        for item in self.faults.plan:
            match = _PLAN_ITEM.match(item)
            assert match is not None  # noqa: S101 - checked by FaultsConfig
            step, rank = int(match["step"]), int(match["rank"] or 0)
            if step >= self.steps:
                raise ValueError(
                    f"faults.plan: {item!r} is at step {step}, but the run's steps are 0..{self.steps - 1}; "
                    f"move it below {self.steps} or raise steps"
                )
            if (step, rank) in seen:
                raise ValueError(
                    f"faults.plan: {item!r} and {seen[step, rank]!r} hit rank {rank} at the same step; "
                    "a rank fires one fault per step: move one of them"
                )
            seen[step, rank] = item
        if self.faults.last_step is not None and self.faults.last_step >= self.steps:
            raise ValueError(
                f"faults.last_step ({self.faults.last_step}) is past the run's last step ({self.steps - 1}); "
                "lower it or raise steps"
            )

    @property
    def inprocess_recovery_silence_s(self) -> float:
        """The longest a rank recovering in process goes without an ft_launcher heartbeat (mode both).

        The in-process layer beats for the rank once a restart is decided and again as the next
        attempt starts (training/resilience/layers.py), so the silence is the longer of two waits,
        not their sum: from the last step until the restart is decided (at most the soft timeout,
        noticed within one monitor interval), and from there until the next attempt (at most one
        collective timeout, for a rank blocked in a gloo collective that cannot be aborted). The
        launcher's heartbeat timeout must exceed it, or it kills ranks the in-process layer is
        restarting; the lower it is, the sooner a deadlock below Python is ended."""
        return max(self.inprocess.soft_timeout_s, self.collective_timeout_s) + self.inprocess.interval_s

    @property
    def collective_timeout_s(self) -> float:
        if self.dist.timeout_s is not None:
            return self.dist.timeout_s
        # gloo collectives cannot be aborted, so an in-process restart waits for the timeout: keep it short.
        return 1.5 if self.mode in {"inprocess", "both"} else 60.0

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


def _flag(path: tuple[str, ...]) -> str:
    return "--" + "-".join(path).replace("_", "-")


def _leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    leaves = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            leaves += _leaves(annotation, (*prefix, name))
        else:
            leaves.append(((*prefix, name), field))
    return leaves


def _describe(field: Any) -> str:  # noqa: ANN401
    default = field.get_default(call_default_factory=True)
    choices = ""
    if get_origin(field.annotation) is Literal:
        choices = f" {{{','.join(map(str, get_args(field.annotation)))}}}"
    return f"{field.description or ''}{choices} (default: {default})"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # type: ignore[override]  # noqa: ANN401
        # One message and exit 2 through UserError, like every other bad input.
        raise UserError(f"{message} (run `python -m training --help` for every flag)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m training",
        description="Reference trainer: Llama-style decoder with NVRx in-process and in-job restart.",
        epilog="Values are parsed as YAML scalars (lists and mappings too: --faults-weights "
        "'{exception: 0.6, hang: 0.4}'). A --config file gives the same fields as a tree; flags win.",
    )
    parser.add_argument("--config", type=Path, default=None, help="YAML file with TrainConfig fields.")
    for path, field in _leaves(TrainConfig):
        parser.add_argument(
            _flag(path), dest=".".join(path), default=None, metavar="V", help=_describe(field)
        )
    return parser


def parse_args(argv: list[str]) -> TrainConfig:
    """Parse the command line; raise UserError (one message for all bad fields) on bad input."""
    namespace = build_parser().parse_args(argv)
    values = vars(namespace)
    config_file = values.pop("config")
    overrides = [f"{key}={value}" for key, value in values.items() if value is not None]
    return load_model(TrainConfig, config_file, overrides, source="trainer config")
