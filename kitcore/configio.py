"""Typed user configuration: load a YAML file plus `key=value` overrides into a pydantic model.

Every entry point (the CDK app, the job renderer, the trainer, the CLI) reports bad input the same
way: one message that names each bad field and how to fix it, exit code 2, no traceback.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator
    from pathlib import Path

USER_ERROR_EXIT_CODE = 2

ModelT = TypeVar("ModelT", bound=BaseModel)


class UserError(Exception):
    """Input the user can fix; the message names the field and the fix."""


def describe_validation_error(error: ValidationError, *, source: str) -> str:
    """One readable message for all of a model's field errors."""
    lines = [f"{source}: {error.error_count()} invalid value(s)"]
    for detail in error.errors():
        field = ".".join(str(part) for part in detail["loc"]) or "(top level)"
        message = detail["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        lines.append(f"  - {field}: {message}")
    return "\n".join(lines)


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Turn `a.b=value` strings into a nested dict; values are parsed as YAML scalars/lists."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"override {item!r} is not of the form key=value (e.g. gpu.max_nodes=4)")
        node = tree
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"override {item!r} sets a field below {part!r}, which is not a section")
        node[leaf] = yaml.safe_load(raw) if raw.strip() else ""
    return tree


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `extra` over `base` (dicts merge, everything else replaces)."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; pass an existing YAML file") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of fields at the top level")
    return data


def load_model(
    model: type[ModelT], path: Path | None = None, overrides: Iterable[str] = (), *, source: str = ""
) -> ModelT:
    """Load `model` from an optional YAML file plus overrides; raise UserError with a full message."""
    data = read_yaml(path) if path is not None else {}
    data = merge(data, parse_overrides(overrides))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise UserError(
            describe_validation_error(exc, source=source or str(path or model.__name__))
        ) from None


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """Print a UserError / ValidationError as one message on stderr and exit 2, without a traceback."""
    try:
        yield
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(USER_ERROR_EXIT_CODE) from None
    except ValidationError as exc:
        print(f"error: {describe_validation_error(exc, source=exc.title)}", file=sys.stderr)
        raise SystemExit(USER_ERROR_EXIT_CODE) from None
