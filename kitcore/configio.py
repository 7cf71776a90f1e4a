"""Typed user configuration: load a YAML file plus `key=value` overrides into a pydantic model.

Every entry point (the CDK app, the job renderer, the trainer, the CLI) reports bad input the same
way: one message that names each bad field and how to fix it, exit code 2, no traceback.
"""

from __future__ import annotations

import json
import sys
import warnings
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from nvrx_eks.kitcore import supervisor
from nvrx_eks.kitcore.lines import say

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from pathlib import Path

USER_ERROR_EXIT_CODE = 2

ModelT = TypeVar("ModelT", bound=BaseModel)


class StaleInput(FutureWarning):
    """A value the kit still reads in a form it will stop reading (a renamed field): warned with
    `warnings.warn(..., StaleInput)` where it is validated, said by the loader as one `warning: ...`
    line naming the value and the fix (`stale_input_said`), never in Python's warning format (the
    validating library's path and source line)."""


@contextmanager
def stale_input_said() -> Iterator[None]:
    """Inside: each `StaleInput` warning is one `warning: MESSAGE` line on stderr; any other warning goes
    on as it would have."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StaleInput)
        yield
    said = set()
    for item in caught:
        if issubclass(item.category, StaleInput):
            if str(item.message) not in said:
                said.add(str(item.message))
                say(f"warning: {item.message}", stream=sys.stderr)
        else:
            warnings.warn_explicit(
                item.message, item.category, item.filename, item.lineno, source=item.source
            )


class UserError(Exception):
    """Input the user can fix; the message names the field and the fix."""

    details: str = ""
    """What helps beyond the message, printed before it: the traceback of a bug in a user's own code."""


def describe_validation_error(error: ValidationError, *, source: str) -> str:
    """One readable message for all of a model's field errors."""
    lines = [f"{source}: {error.error_count()} invalid value(s)"]
    for detail in error.errors():
        field = ".".join(str(part) for part in detail["loc"]) or "(top level)"
        message = detail["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        lines.append(f"  - {field}: {message}")
    return "\n".join(lines)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping with the same key twice.

    PyYAML keeps the last value of a repeated key without a word (YAML 1.2 says keys must be unique):
    a config with `gpu:` twice would silently lose the first section.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first set on line {first}): keep one of them",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def safe_load(text: str) -> Any:  # noqa: ANN401 - any YAML value
    """yaml.safe_load, with duplicate keys an error (yaml.YAMLError) instead of a silent merge."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_text(path: Path, *, what: str = "YAML file") -> str:
    """A file's UTF-8 text; a missing file, a folder, an unreadable or non-UTF-8 file is a UserError."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; pass an existing {what}") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder; pass a {what} (e.g. {path}/values.yaml)") from None
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            f"pass a {what} saved as UTF-8"
        ) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror}); pass a readable {what}") from None


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
        node[leaf] = _override_value(item, raw)
    return tree


def _override_value(item: str, raw: str) -> Any:  # noqa: ANN401 - any YAML value
    if not raw.strip():
        return ""
    try:
        return safe_load(raw)
    except yaml.YAMLError as exc:
        raise UserError(
            f"override {item!r}: the value is not valid YAML ({_yaml_problem(exc, lines=False)}); close "
            "the bracket or quote, or quote the whole value to pass it as text (e.g. key='\"[a\"')"
        ) from None


def _yaml_problem(exc: yaml.YAMLError, *, lines: bool = True) -> str:
    """The problem PyYAML found and where, without its echo of the whole input."""
    if not isinstance(exc, yaml.MarkedYAMLError) or not exc.problem:
        return str(exc).splitlines()[0]
    mark = exc.problem_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if lines and mark is not None else ""
    return f"{where}{exc.problem}"


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
    """A YAML file's top-level mapping; every way the file can be wrong is one UserError."""
    text = read_text(path)
    try:
        data = safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({_yaml_problem(exc)})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of fields at the top level")
    return data


def read_yaml_documents(path: Path, *, what: str) -> list[dict[str, Any]]:
    """Every document of a multi-document YAML file, each a mapping; anything else is one UserError."""
    text = read_text(path, what=what)
    try:
        docs = list(yaml.load_all(text, Loader=_UniqueKeyLoader))
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({_yaml_problem(exc)}); pass a {what}") from None
    for number, doc in enumerate(docs, start=1):
        if doc is not None and not isinstance(doc, dict):
            raise UserError(
                f"{path}: document {number} is a {type(doc).__name__}, not a mapping; pass a {what}"
            )
    return [doc for doc in docs if doc]


def read_json(path: Path, *, what: str) -> dict[str, Any]:
    """A JSON file's top-level object; missing, unreadable, truncated or not an object: one UserError."""
    text = read_text(path, what=what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}; "
            f"pass a complete {what}"
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object at the top level; pass a {what}")
    return data


def validate_file(model: type[ModelT], data: object, path: Path, *, what: str) -> ModelT:
    """`data` read from `path` checked against `model`: a missing or mistyped field is one UserError
    naming the file and the field."""
    try:
        with stale_input_said():
            return model.model_validate(data)
    except ValidationError as exc:
        message = describe_validation_error(exc, source=str(path))
        raise UserError(f"{message}\n  (expected a {what})") from None


def load_model(
    model: type[ModelT], path: Path | None = None, overrides: Iterable[str] = (), *, source: str = ""
) -> ModelT:
    """Load `model` from an optional YAML file plus overrides; raise UserError with a full message."""
    data = read_yaml(path) if path is not None else {}
    data = merge(data, parse_overrides(overrides))
    try:
        with stale_input_said():
            return model.model_validate(data)
    except ValidationError as exc:
        raise UserError(
            describe_validation_error(exc, source=source or str(path or model.__name__))
        ) from None


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """Print a UserError / ValidationError as one message on stderr and exit 2, without a traceback (a
    UserError may carry one as `details`, for a bug in a user's own code: printed before the message)."""
    try:
        yield
    except UserError as exc:
        _exit_with_message(str(exc), details=exc.details)
    except ValidationError as exc:
        _exit_with_message(describe_validation_error(exc, source=exc.title))


def _exit_with_message(message: str, *, details: str = "") -> NoReturn:
    """The message on stderr (after `details`, a traceback, when there is one) and, folded into one
    line, to the launcher that runs this process, if any (kitcore/supervisor.py); exit 2."""
    if details:
        say(details.rstrip(), stream=sys.stderr)
    say(f"error: {message}", stream=sys.stderr)
    supervisor.tell(message, details=details)
    raise SystemExit(USER_ERROR_EXIT_CODE) from None


def exit_with(main: Callable[[], int]) -> NoReturn:
    """A command line's end: exit with `main()`'s code, a UserError or ValidationError as one message
    and exit 2 (`exit_on_user_error`)."""
    with exit_on_user_error():
        code = main()
    raise SystemExit(code)
