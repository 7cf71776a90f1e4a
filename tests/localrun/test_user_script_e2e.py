"""A training script the kit did not write, under the local job: every fault class recovered by its layer
with a bit-identical verdict (a Hugging Face Llama, examples/hf_llama; the same Llama with its own
tensor parallelism and FSDP2 on a 2-D mesh, examples/hf_llama_tp), a project whose own package is
named `training` (examples/own_package), and a bug in a script that ends the job once instead of
spending every restart budget."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from nvrx_eks.k8s.termination import failure_cause, log_tail
from nvrx_eks.localrun.demo import DEMO_FAULTS

ROOT = Path(__file__).resolve().parents[2]
HF_VALUES = ROOT / "k8s" / "values" / "local-hf-llama.yaml"
HF_TP_VALUES = ROOT / "k8s" / "values" / "local-hf-llama-tp.yaml"
OWN_PACKAGE = ROOT / "examples" / "own_package"
DEMO_STEPS = max(int(item.split("@")[1].split(":")[0]) for item in DEMO_FAULTS) + 4
"""The Llama chaos runs' steps: up to the demo's last fault and a few restored and trained after it. The
values files' 80 leave the fault-free run and the chaos run their last steps with no fault in them."""


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(600)
def test_a_transformers_llama_recovers_every_fault_class_bit_identically(tmp_path, nvrx_eks, references):
    # FSDP2 x tensor parallel on the attempt's mesh: the hardest layout. The same Llama on one data
    # parallel axis runs every fault class below (its own DDP) and in `nvrx-eks demo -f` runs.
    # The fault-free reference from the checkout's shared cache (tests/conftest.py REFERENCES).
    cache = ("--cache", str(references))
    result = nvrx_eks(
        "demo", "-f", str(HF_TP_VALUES), "--skip-synth", "--runs", str(tmp_path), *cache,
        "--set", f"entrypoint.args=[--steps, '{DEMO_STEPS}']", timeout=560,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (summary_path,) = tmp_path.glob("demo-*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["final_params_sha256"] == summary["fault_free_params_sha256"]
    assert {f["class"] for f in summary["faults"]} == {item.split("@")[0] for item in DEMO_FAULTS}
    for fault in summary["faults"]:
        assert fault["layer"] == fault["expected_layer"], fault
        if fault["layer"] == "inprocess":
            assert fault["steps_lost"] == 0, fault
    # The script's own (dp, tp) mesh, rebuilt at every attempt.
    events_dir = next(tmp_path.glob("demo-*/chaos/volumes/*/runs/*/events"))
    meshes = [
        json.loads(line)["mesh"]
        for path in events_dir.glob("rank-*.jsonl")
        for line in path.read_text().splitlines()
        if '"device_mesh"' in line
    ]
    assert meshes
    assert all(mesh == {"dp": 2, "tp": 2} for mesh in meshes), meshes


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_project_with_its_own_training_package_runs_under_the_kits_launcher(
    tmp_path, local_job, monkeypatch
):
    """The project's `training.loop`, `training.data` and `training.model` share their names with the
    kit's trainer folder; the kit is `nvrx_eks.training`, so the job's module, the forkserver's preload
    and every restarted worker import the project's own, and its faults are recovered as any script's."""
    from nvrx_eks.localrun.summary import summarize  # noqa: PLC0415

    monkeypatch.chdir(OWN_PACKAGE)  # the executor puts the folder nvrx-eks runs in on the pods' path
    runner = type(local_job)()
    runner.values = HF_VALUES
    overrides = [
        "entrypoint.module=training.loop",
        "entrypoint.args=[--steps, '30']",
        "entrypoint.preload=[training.loop]",
        "trainer.faults.plan=exception@8:1,sigkill@16:2",
    ]
    _, trainer_run_dir = runner.run(tmp_path / "run", overrides, timeout_s=240)
    faults = summarize(trainer_run_dir).faults
    assert [(f.cls, f.layer) for f in faults] == [("exception", "inprocess"), ("sigkill", "ft_launcher")]
    assert all(f.layer == f.expected_layer for f in faults), faults


def _buggy_script(*, steps: int, bug_when: str) -> str:
    """A kit script whose step raises the same ValueError when `bug_when` holds (step and rank in scope)."""
    return f"""
import torch

from nvrx_eks.training import api as kit


def train(attempt):
    model = torch.nn.Linear(4, 4)
    wrapped = attempt.data_parallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    attempt.resume(model=model, optimizer=optimizer)
    for step in attempt.steps({steps}):
        if {bug_when}:
            raise ValueError("shapes do not match: a bug in the step")
        wrapped(torch.ones(2, 4)).sum().backward()
        with attempt.update():
            optimizer.step()


kit.Job().run(train)
"""


_BUGGY = _buggy_script(steps=40, bug_when="step == 12 and attempt.rank == 1")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_bug_in_the_script_ends_the_job_once_with_its_traceback(tmp_path, local_job):
    script = tmp_path / "buggy.py"
    script.write_text(textwrap.dedent(_BUGGY))
    runner = type(local_job)()  # the session's runner stays on the reference job's values
    runner.values = HF_VALUES
    overrides = ["entrypoint.module=null", f"entrypoint.script={script}", "entrypoint.args=[]"]
    result, events = runner.run(
        tmp_path / "run", [*overrides, "entrypoint.preload=[]"], timeout_s=240, must_succeed=False
    )
    assert not result.succeeded
    assert "PodFailurePolicy" in result.reason, result.reason
    # One in-process restart proved it deterministic; no launcher restart, no replaced pod.
    starts = local_job.events(events, "attempt_start")
    assert max(e["attempt"] for e in starts) == 1, starts
    assert {e["restart"] for e in starts} == {0}
    assert len(result.pods) == 3
    (bug,) = local_job.events(events, "user_code_error")
    assert (bug["rank"], bug["step"]) == (1, 12)
    assert "ValueError: shapes do not match: a bug in the step" in bug["traceback"]
    assert str(script) in bug["traceback"]
    # What `nvrx-eks job status` shows for the pod of rank 1: the rank and its error.
    pod = next(p for p in result.pods if p.pod.endswith("-0-a0"))
    cause = failure_cause(log_tail(Path(pod.log).read_text()))
    assert "local rank 1" in cause.text, cause
    assert "ValueError: shapes do not match" in cause.text, cause


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("entrypoint.module=examples.no_such.train", "error: entrypoint.module examples.no_such.train: "),
        ("entrypoint.script=no_such/train.py", "error: entrypoint.script no_such/train.py: no such file"),
    ],
    ids=["module", "script"],
)
def test_the_demo_of_an_entry_point_that_is_not_there_is_one_line_and_exit_2(
    tmp_path, nvrx_eks, entry, message
):
    """Before anything is synthesized, rendered or run: no fault-free run, no chaos run, no report."""
    result = nvrx_eks(
        "demo", "-f", str(HF_VALUES), "--skip-synth", "--runs", str(tmp_path),
        "--set", "entrypoint.module=null", "--set", entry, "--set", "entrypoint.preload=[]",
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith(message), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not list(tmp_path.iterdir())


_BUG_ON_EVERY_RANK = _buggy_script(steps=80, bug_when="step == 5")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_demo_stops_at_a_failed_fault_free_reference_with_its_reason(tmp_path, nvrx_eks):
    """No chaos run, no report of a run that did not happen, no traceback: the script's bug in one line,
    exit 2. Every rank raising alike is one failure, retried once in process, then the bug."""
    script = tmp_path / "buggy.py"
    script.write_text(textwrap.dedent(_BUG_ON_EVERY_RANK))
    runs = tmp_path / "runs"
    result = nvrx_eks(
        "demo", "-f", str(HF_VALUES), "--skip-synth", "--runs", str(runs),
        "--set", "entrypoint.module=null", "--set", f"entrypoint.script={script}",
        "--set", "entrypoint.preload=[]", timeout=280,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 2, out[-4000:]
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("the fault-free reference failed: ")]
    assert "the training script failed the same way twice on rank" in line, line
    assert "at step 5: ValueError: shapes do not match: a bug in the step (" in line, line
    assert "4. Chaos run" not in out
    assert "Traceback" not in out
    (demo,) = runs.glob("demo-*")
    assert not (demo / "chaos").exists()
    assert not (demo / "summary.json").exists()
    events = [json.loads(x) for p in demo.rglob("rank-*.jsonl") for x in p.read_text().splitlines()]
    assert max(e["attempt"] for e in events if e["kind"] == "attempt_start") == 1  # retried once


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_local_run_of_a_job_whose_module_is_not_there_is_one_line_and_exit_2(tmp_path, nvrx_eks):
    """The launcher of each pod checks the entry point before any rank starts (the rendered job cannot
    know what the image holds): the job fails with that line as its reason, exit 2."""
    dist = tmp_path / "dist"
    rendered = nvrx_eks(
        "job", "render", "-f", str(HF_VALUES), "-o", str(dist),
        "--set", "entrypoint.module=examples.no_such.train", "--set", "entrypoint.preload=[]",
        timeout=120,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr[-3000:]
    run_dir = tmp_path / "run"
    result = nvrx_eks("local", "run", str(dist), "--run-dir", str(run_dir), "--timeout", "200", timeout=280)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out[-4000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("job FAILED: PodFailurePolicy: pod "), last
    assert "exit code 2 fails the job: entrypoint.module examples.no_such.train: ModuleNotFoundError" in last
    assert "Traceback" not in out
    assert "To enable traceback" not in out
    logs = "".join(p.read_text() for p in (run_dir / "pods").glob("*-0-a0.log"))
    assert "starting workers" not in logs  # ft_launcher's line before it starts any rank


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(600)
def test_the_scripts_own_ddp_is_recovered_and_its_difference_measured_and_explained(
    tmp_path, nvrx_eks, references
):
    """The same Llama with its own DistributedDataParallel: every fault recovered by its layer; its
    restarts reorder DDP's reduction, so the verdict is not bit-identity but the measured difference and
    the reason, and the demo passes on that explanation (never silently either way)."""
    args = f"entrypoint.args=[--steps, '{DEMO_STEPS}', --parallel, ddp]"
    cache = ("--cache", str(references))
    result = nvrx_eks(
        "demo", "-f", str(HF_VALUES), "--skip-synth", "--runs", str(tmp_path), *cache, "--set", args,
        timeout=560,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (summary_path,) = tmp_path.glob("demo-*/summary.json")
    summary = json.loads(summary_path.read_text())
    for fault in summary["faults"]:
        assert fault["layer"] == fault["expected_layer"], fault
    numerics = summary["numerics"]
    assert numerics["parallelism"] == ["replicated"], numerics
    if not summary["bit_identical"]:
        assert "rebuilds its gradient buckets" in numerics["explained"]
        assert 0 < numerics["difference"]["max_abs_diff"] < 1e-2, numerics
        assert "why: the script's own data parallelism" in result.stdout
