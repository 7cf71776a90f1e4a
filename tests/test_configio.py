"""The one loader (kitcore/configio.py): every way a file or an override can be wrong is one message.

Each CLI that takes a config/values file or `key=value` overrides goes through it; the CLI cases below
run the commands as a user types them and check for exit 2, the message and no traceback.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from nvrx_eks.kitcore.configio import UserError, load_model, parse_overrides, read_yaml

REPO = Path(__file__).resolve().parents[1]
LOCAL_VALUES = REPO / "k8s" / "values" / "local-cpu.yaml"


class _Model(BaseModel):
    a: int = 0
    b: dict[str, int] = {}
    items: list[int] = []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("items=[1, 2", "override 'items=[1, 2': the value is not valid YAML"),
        ("b={x: 1", "override 'b={x: 1': the value is not valid YAML"),
        ("a='unclosed", 'override "a=\'unclosed": the value is not valid YAML'),
        ("b={x: 1, x: 2}", "duplicate key 'x'"),
    ],
)
def test_an_override_that_is_not_yaml_is_one_message(override, message):
    with pytest.raises(UserError) as info:
        load_model(_Model, None, [override])
    assert message in str(info.value)
    assert "quote the whole value" in str(info.value)


def test_a_quoted_override_is_text():
    assert parse_overrides(["a.b='[x'"]) == {"a": {"b": "[x"}}


def test_a_folder_is_not_a_config_file(tmp_path):
    with pytest.raises(UserError, match="is a folder; pass a YAML file"):
        read_yaml(tmp_path)


def test_a_file_that_is_not_utf8_is_one_message(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"not UTF-8 text \(byte 0xe9 at offset 9\)"):
        read_yaml(path)


def test_duplicate_keys_are_refused_with_the_key_and_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("a: 1\nb:\n  x: 1\n  y: 2\n  x: 3\n")
    with pytest.raises(UserError) as info:
        read_yaml(path)
    assert "line 5" in str(info.value)
    assert "duplicate key 'x' (first set on line 3)" in str(info.value)
    # The same key in two different mappings is not a duplicate.
    path.write_text("a: {x: 1}\nb: {x: 2}\n")
    assert read_yaml(path) == {"a": {"x": 1}, "b": {"x": 2}}


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


def _nvrx_eks(*args: str) -> subprocess.CompletedProcess[str]:
    return _cli("-c", "from nvrx_eks.cli import main; main()", *args)


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"name: caf\xe9\n")
    dup = tmp_path / "dup.yaml"
    dup.write_text("name: a\nnum_nodes: 1\nname: b\n")
    return {
        "folder": (folder, "is a folder"),
        "latin1": (latin1, "not UTF-8 text"),
        "dup": (dup, "duplicate key 'name'"),
    }


_BUCKET = "storage.s3_bucket=[unclosed"
_REGION = "region=[unclosed"


@pytest.mark.parametrize(
    "command",
    [
        ("job", "render", "-f", str(LOCAL_VALUES), "--set", _BUCKET),
        ("job", "submit", "-f", str(LOCAL_VALUES), _BUCKET),
        ("demo", "--skip-synth", "-f", str(LOCAL_VALUES), "--set", _BUCKET),
        ("synth", "--set", _REGION),
        ("preflight", "-c", "infra/configs/default.yaml", _REGION),
    ],
    ids=["job-render", "job-submit", "demo", "synth", "preflight"],
)
def test_every_cli_reports_a_bad_override_as_one_message(command, tmp_path):
    extra = ("--runs", str(tmp_path)) if command[0] == "demo" else ()
    proc = _nvrx_eks(*command, *extra)
    assert proc.returncode == 2, proc.stderr
    assert "the value is not valid YAML" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_trainer_flags_report_a_bad_value_as_one_message():
    proc = _cli("-m", "nvrx_eks.training", "--optim-lr", "{0.6", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "optim.lr" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("case", ["folder", "latin1", "dup"])
def test_values_and_config_files_that_cannot_be_read(case, tmp_path):
    path, message = _bad_inputs(tmp_path)[case]
    for command in (
        ("job", "render", "-f", str(path), "-o", str(tmp_path / "out")),
        ("synth", "-c", str(path)),
    ):
        proc = _nvrx_eks(*command)
        assert proc.returncode == 2, (command, proc.stderr)
        # The error as one line: typer's error box (a path refused while parsing) and its wrapping removed.
        assert message in re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", proc.stderr))
        assert "Traceback" not in proc.stderr
    proc = _cli("-m", "nvrx_eks.training", "--config", str(path), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    # `values -o FILE` updates an existing values file: read (and refused) before any AWS call.
    proc = _nvrx_eks("values", "--stack", "nvrx-eks", "-o", str(path), "--region", "us-east-1")
    assert proc.returncode == 2, proc.stderr
    assert message in re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", proc.stderr)) or (
        case == "dup" and 'line 3, column 1: found duplicate key "name"' in proc.stderr
    )
    assert "Traceback" not in proc.stderr
