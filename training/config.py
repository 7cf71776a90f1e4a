"""The reference trainer's own typed configuration and command line: model preset, steps, data, optimizer.

The kit's part of a run (mode, run folder, checkpoint tiers, fault schedule, ...) is not here: it reaches
the reference trainer as it reaches any script, through `NVRX_EKS_CONFIG` and `kit.Job()`
(training/resilience/config.py `ResilienceConfig`).
`python -m nvrx_eks.training [--config FILE] [--FLAG VALUE ...]`: every field of `TrainConfig` (nested
sections included) is a flag, generated from the model so the two never drift: `--steps`, `--model`,
`--data-batch-size`, `--optim-lr`, ... `--help` lists each with its description and default. A YAML file
gives the same fields as a tree; flags override it. Bad input is one message naming the field and the
fix (kitcore.configio.UserError -> exit 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nvrx_eks.kitcore.configio import UserError, load_model
from nvrx_eks.training.shapes import PRESETS


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


class TrainConfig(_Section):
    """The reference trainer's own settings: its model, data and optimizer, and how long it trains."""

    model: str = Field("tiny", description=f"Model preset: {', '.join(PRESETS)}.")
    steps: int = Field(50, ge=1, description="Optimizer steps to train.")
    seed: int = Field(0, description="Seed for the weights and the synthetic data.")
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

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in PRESETS:
            raise ValueError(f"unknown preset {value!r}; choose one of {', '.join(PRESETS)}")
        return value


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
    def error(self, message: str) -> NoReturn:
        # One message and exit 2 through UserError, like every other bad input.
        raise UserError(f"{message} (run `python -m nvrx_eks.training --help` for every flag)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m nvrx_eks.training",
        # No abbreviations: `--mode` (a kit setting, NVRX_EKS_CONFIG's) must not be read as `--model`.
        allow_abbrev=False,
        description="Reference trainer: Llama-style decoder with NVRx in-process and in-job restart.",
        epilog="Values are parsed as YAML scalars. A --config file gives the same fields as a tree; flags "
        "win. The kit's settings (mode, checkpoints, faults, ...) come from NVRX_EKS_CONFIG, as for any "
        "script (docs/your-script.md).",
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
