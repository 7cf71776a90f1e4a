"""Bad input to `nvrx-eks`, typed as a new user would: exit 2, one message naming the option or field
and the fix, no traceback, nothing lost.

Each case runs the real command in a child process (the `nvrx_eks` fixture) on files in a temporary
folder, by class: path options (kitcore/paths.py), files the commands read (kitcore/configio.py
read_json / read_yaml_documents / validate_file), and the order of checks before any AWS call.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PEER = REPO / "tests" / "planner" / "data" / "peer-hardware" / "peer.json"
PLAN = REPO / "planner" / "examples" / "peer-16-h100.yaml"
LOCAL_VALUES = REPO / "k8s" / "values" / "local-cpu.yaml"
CLI_S = 120
START_EVENT = '{"kind": "process_start", "t": 1.0}\n'


def _one_message(text: str) -> str:
    """The error as one line: typer's error box and its line wrapping removed."""
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text))


def _plan_with(tmp_path: Path, **fields: object) -> Path:
    import yaml  # noqa: PLC0415

    data = yaml.safe_load(PLAN.read_text()) | fields
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _peer_without(tmp_path: Path, section: str, key: str) -> Path:
    doc = json.loads(PEER.read_text())
    del doc[section][key]
    folder = tmp_path / "peer-run"
    folder.mkdir()
    (folder / "peer.json").write_text(json.dumps(doc))
    return folder


def _read_only_values(tmp_path: Path) -> Path:
    path = tmp_path / "ro-job.yaml"
    shutil.copy(LOCAL_VALUES, path)
    path.chmod(stat.S_IRUSR | stat.S_IRGRP)
    return path


def _run_folder(tmp_path: Path, *, events: str, summary: str | None) -> Path:
    run = tmp_path / "run"
    (run / "events").mkdir(parents=True)
    (run / "events" / "rank-0.jsonl").write_text(events)
    if summary is not None:
        (run / "summary.json").write_text(summary)
    return run


def _dist(tmp_path: Path, text: str) -> Path:
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "job.k8s.yaml").write_text(text)
    return dist


# (case id, args built from tmp_path, fragments the one message must contain)
CASES = {
    # class 2: planner output paths and plan shapes
    "plan --out onto a file": (
        lambda t: ["plan", str(PLAN), "--no-simulate", "--out", str(_touch(t / "afile"))],
        ["Invalid value for '--out'", "is a file; pass a folder for the PNG plots"],
    ),
    "plan --write onto a folder": (
        lambda t: ["plan", str(PLAN), "--no-simulate", "--no-plots", "--write", str(t)],
        ["Invalid value for '--write'", "is a folder; pass a job values YAML file"],
    ),
    "plan --write onto a read-only file": (
        lambda t: ["plan", str(PLAN), "--no-simulate", "--no-plots", "--write", str(_read_only_values(t))],
        ["Invalid value for '--write'", "is read-only; make it writable"],
    ),
    "plan name too long for its folder": (
        lambda t: ["plan", str(_plan_with(t, name="x" * 300)), "--no-simulate"],
        ["name: 300 bytes is too long for the plot folder", "shorten it"],
    ),
    "plan modes: {}": (
        lambda t: ["plan", str(_plan_with(t, modes={})), "--no-simulate", "--no-plots"],
        ["modes: lists no mode; name at least one of baseline"],
    ),
    "plan --from a peer.json missing a key": (
        lambda t: [
            "plan",
            "--from",
            str(_peer_without(t, "scenario", "steps")),
            "--no-simulate",
            "--no-plots",
        ],
        ["peer.json: 1 invalid value(s)", "scenario.steps: Field required", "rerun it"],
    ),
    # class 3: report on broken run folders
    "report on empty event files": (
        lambda t: ["report", str(_run_folder(t, events="", summary=None))],
        ["hold no trainer events", "pass a run folder of a run that trained"],
    ),
    "report on a truncated summary.json": (
        lambda t: [
            "report",
            str(
                _run_folder(t, events='{"kind": "process_start", "t": 1.0}\n', summary='{"mode": "both", "st')
            ),
        ],
        ["summary.json: not valid JSON at line 1", "pass a complete summary.json"],
    ),
    # class 4: local run on what is not one local job
    "local run on bad YAML": (
        lambda t: ["local", "run", str(_dist(t, "kind: Job\n  bad: [\n"))],
        ["job.k8s.yaml: not valid YAML (line 2", "pass a rendered manifest"],
    ),
    "local run on a manifest that is a list": (
        lambda t: ["local", "run", str(_dist(t, "- kind: Job\n- kind: Service\n"))],
        ["document 1 is a list, not a mapping"],
    ),
    "local run on a missing folder": (
        lambda t: ["local", "run", str(t / "no-such-dist")],
        ["Invalid value for 'DIST_DIR'", "no such folder; pass an existing folder of one rendered job"],
    ),
    "local run --delete-node with a non-number": (
        lambda t: ["local", "run", str(_dist(t, "kind: Job\n")), "--delete-node", "1@soon"],
        ["--delete-node '1@soon' is not INDEX@SECONDS", "e.g. 1@20"],
    ),
    # class 9: a folder where a file goes names the flag
    "synth --config a folder": (
        lambda t: ["synth", "--config", str(t)],
        ["Invalid value for '--config' / '-c'", "is a folder; pass a cluster config YAML file"],
    ),
    "preflight -c a folder": (
        lambda t: ["preflight", "-c", str(t)],
        ["Invalid value for '-c' / '--config'", "is a folder; pass a cluster config YAML file"],
    ),
    "job render -f a folder": (
        lambda t: ["job", "render", "-f", str(t)],
        ["Invalid value for '-f' / '--values'", "is a folder; pass a job values YAML file"],
    ),
    "job render -o onto a file": (
        lambda t: ["job", "render", "-f", str(LOCAL_VALUES), "-o", str(_touch(t / "afile"))],
        ["Invalid value for '-o' / '--out'", "is a file; pass a folder for the rendered manifests"],
    ),
}


def _touch(path: Path) -> Path:
    path.write_text("keep me\n")
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_message(nvrx_eks, tmp_path, case):
    build, fragments = CASES[case]
    args = build(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    result = nvrx_eks(*args, timeout=CLI_S)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output
    message = _one_message(result.stderr)
    for fragment in fragments:
        assert fragment in message, message
    # Nothing lost: every file the user had is as it was.
    assert {p: p.read_bytes() for p in before} == before


def test_local_run_refuses_a_temp_folder_too_long_for_the_pods_sockets(nvrx_eks, tmp_path):
    """Each local pod's TMPDIR is a folder in the machine's temp folder, where ft_launcher and the
    forkserver bind unix sockets (107 characters at most): a longer one is refused before any pod
    starts, instead of failing inside every launcher restart."""
    deep = tmp_path / ("t" * 60)
    deep.mkdir()
    run_dir = tmp_path / "run"
    result = nvrx_eks(
        "local",
        "run",
        str(_dist(tmp_path, "kind: Job\n")),
        "--run-dir",
        str(run_dir),
        timeout=CLI_S,
        env={"TMPDIR": str(deep)},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    message = _one_message(result.stderr)
    assert f"TMPDIR: the temp folder {deep} is {len(str(deep))} characters long" in message, message
    assert "TMPDIR=/tmp" in message
    assert not (run_dir / "pods").exists()


@pytest.mark.slow
@pytest.mark.shareable
def test_local_run_refuses_a_p5_rendering(nvrx_eks, tmp_path):
    """A job rendered for p5 asks for GPUs, EFA and a registry image: refused, no pod started."""
    dist = tmp_path / "dist"
    render = nvrx_eks("job", "render", "-f", "k8s/values/p5-2.yaml", "-o", str(dist), timeout=300)
    assert render.returncode == 0, render.stderr
    result = nvrx_eks("local", "run", str(dist), "--run-dir", str(tmp_path / "run"), timeout=CLI_S)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    message = _one_message(result.stderr)
    assert "rendered for a cluster" in message
    assert "trainer requests nvidia.com/gpu" in message
    assert "nvrx-eks job render -f k8s/values/local-cpu.yaml" in message
    assert not (tmp_path / "run" / "pods").exists()


def test_preflight_reports_a_bad_values_file_before_credentials(nvrx_eks, tmp_path, monkeypatch):
    """The values file is read before the first AWS call: its error, not 'no AWS credentials'."""
    bad = tmp_path / "job.yaml"
    bad.write_text("name: [\n")
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = nvrx_eks(
        "preflight", "-c", "infra/configs/default.yaml", "--job-values", str(bad), timeout=CLI_S
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{bad}: not valid YAML" in result.stderr
    assert "credentials" not in result.stderr
