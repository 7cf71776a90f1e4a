"""The reference trainer's typed configuration and command line.

`TrainConfig` is the kit's `ResilienceConfig` (training/resilience/config.py) and the reference
trainer's own fields (model preset, steps, data, optimizer).
`python -m nvrx_eks.training [--config FILE] [--FLAG VALUE ...]`: every field of `TrainConfig` (nested
sections included) is a flag, generated from the model so the two never drift: `--steps`,
`--run-dir`, `--inprocess-soft-timeout-s`, `--faults-plan`, ... `--help` lists each with its
description and default. A YAML file gives the same fields as a tree; flags override it. Bad input is
one message naming the field and the fix (kitcore.configio.UserError -> exit 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nvrx_eks.kitcore.configio import UserError, load_model
from nvrx_eks.training.resilience.config import (
    ResilienceConfig,
    check_fault_plan,
    config_document,
    config_leaves,
)
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


class TrainConfig(ResilienceConfig):
    """The reference trainer: the kit's resilience settings and its own model, data and optimizer."""

    model: str = Field("tiny", description=f"Model preset: {', '.join(PRESETS)}.")
    steps: int = Field(50, ge=1, description="Optimizer steps to train.")
    seed: int = Field(0, description="Seed for weights, data and the fault draw.")
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

    @model_validator(mode="after")
    def _faults_fit_the_steps(self) -> TrainConfig:
        check_fault_plan(self.faults, steps=self.steps)
        return self


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


def _value(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value)  # e.g. faults.plan: CLASS@STEP[:RANK],...
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def to_args(config: ResilienceConfig) -> list[str]:
    """The flags `parse_args` reads back to `config` (a `TrainConfig`, or the kit's part of one): one
    `--a-b VALUE` per field it was given."""
    args: list[str] = []
    for path, value in config_leaves(config_document(config)):
        args += [_flag(path), _value(value)]
    return args


def parse_args(argv: list[str]) -> TrainConfig:
    """Parse the command line; raise UserError (one message for all bad fields) on bad input."""
    namespace = build_parser().parse_args(argv)
    values = vars(namespace)
    config_file = values.pop("config")
    overrides = [f"{key}={value}" for key, value in values.items() if value is not None]
    return load_model(TrainConfig, config_file, overrides, source="trainer config")
