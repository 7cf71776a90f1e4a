"""The report a user reads (table, summary.json, timeline) and the pieces the demo and peer bench compose."""

from __future__ import annotations

import html
import json
import platform
import struct
from importlib import metadata
from pathlib import Path

import pytest
from rich.console import Console

from nvrx_eks.bench.peer import durable_every, mode_setups
from nvrx_eks.k8s.load import load_values
from nvrx_eks.localrun.chaos import (
    Progress,
    _progress_line,
    code_files,
    fault_free_key,
    reference_trainer,
    without_faults,
)
from nvrx_eks.localrun.report import (
    FAULT_KEYS,
    FLEET_PLAN,
    SUMMARY_KEYS,
    plot_timeline,
    print_report,
    render_html,
    summary_document,
    totals_in_scale,
    write_summary,
)
from nvrx_eks.localrun.summary import summarize
from nvrx_eks.training.config import parse_args
from nvrx_eks.training.events import read_events
from nvrx_eks.training.resilience.config import FaultsConfig

REPO = Path(__file__).resolve().parents[2]

LOCAL_VALUES = Path("k8s/values/local-cpu.yaml")
HF_VALUES = REPO / "k8s" / "values" / "local-hf-llama.yaml"


def _write(run_dir: Path, rank: int, events: list[dict]) -> None:
    path = run_dir / "events" / f"rank-{rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for event in events:
            f.write(json.dumps({"rank": rank, "restart": 0, "node": "0"} | event) + "\n")


def _soft_fault_run(run_dir: Path) -> None:
    """One rank, 6 steps; an exception at step 3 recovered in-process (same pid) from memory."""
    events = [
        {"t": 0.0, "kind": "process_start", "pid": 1, "mode": "both", "steps": 6},
        {
            "t": 0.5,
            "kind": "startup_done",
            "pid": 1,
            "restored_step": -1,
            "tier": "none",
            "state_bytes": 4_000_000,
            "memcpy_gbps": 4.0,
        },
    ]
    events += [
        {
            "t": 1.0 + s,
            "kind": "step",
            "pid": 1,
            "step": s,
            "step_s": 0.9,
            "ckpt_s": 0.002,
            "loss": 4.0 - s / 10,
        }
        for s in range(3)
    ]
    events += [
        {"t": 3.2, "kind": "checkpoint_staged", "pid": 1, "step": 2},
        {
            "t": 3.5,
            "kind": "fault_injected",
            "pid": 1,
            "class": "exception",
            "step": 3,
            "target_rank": 0,
            "expected_layer": "inprocess",
            "index": 0,
        },
        {"t": 3.6, "kind": "detected", "pid": 1, "layer": "inprocess", "cause": "InjectedFaultError"},
        {"t": 4.0, "kind": "attempt_start", "pid": 1, "attempt": 1},
        {
            "t": 4.5,
            "kind": "startup_done",
            "pid": 1,
            "restored_step": 2,
            "load_s": 0.2,
            "tier": "inprocess",
            "state_bytes": 4_000_000,
            "memcpy_gbps": 4.0,
        },
    ]
    events += [
        {
            "t": 5.0 + i,
            "kind": "step",
            "pid": 1,
            "step": s,
            "step_s": 0.9,
            "ckpt_s": 0.002,
            "loss": 3.7 - i / 10,
        }
        for i, s in enumerate(range(3, 6))
    ]
    events += [{"t": 8.0, "kind": "end", "pid": 1, "steps": 6, "final_params_sha256": "f" * 64}]
    _write(run_dir, 0, events)


def test_summary_json_has_the_keys_other_tools_read(tmp_path):
    _soft_fault_run(tmp_path)
    document = summary_document(summarize(tmp_path), fault_free_sha256="f" * 64)
    assert list(document)[: len(SUMMARY_KEYS)] == list(SUMMARY_KEYS)
    (fault,) = document["faults"]
    assert list(fault)[: len(FAULT_KEYS)] == list(FAULT_KEYS)
    assert fault["class"] == "exception"
    assert fault["layer"] == "inprocess"
    assert fault["steps_lost"] == 0
    assert fault["recovery_s"] == pytest.approx(1.0)
    assert document["bit_identical"] is True
    assert document["stall_floor_s"] == pytest.approx(0.001)
    # What the figures were measured with, so runs of different releases are never compared unknowingly.
    assert document["versions"] == {
        "nvrx": metadata.version("nvidia-resiliency-ext"),
        "torch": metadata.version("torch"),
        "python": platform.python_version(),
    }
    # In process: the new attempt starts 0.4 s after detection, the group and barrier take the rest
    # of the time to the restored state, the first step ends 0.5 s later; they add up to 5.0 - 3.5.
    assert fault["tier"] == "memory"
    assert fault["phases"] == pytest.approx(
        {
            "detect_s": 0.1,
            "teardown_s": 0.4,
            "rendezvous_s": 0.3,
            "start_s": 0.0,
            "restore_s": 0.2,
            "first_step_s": 0.5,
        }
    )
    written = json.loads(write_summary(tmp_path, document).read_text())
    assert written == document


def test_phases_of_a_launcher_restart_add_up_to_fault_to_first_step(tmp_path):
    """SIGKILL of rank 1 at t=10: the survivor is stopped at 10.3, new workers are created at 11.0 and
    11.1, ready at 13.0 / 13.2, restored from memory (load 0.3 / 0.4 s) and step again at 14.5 / 14.6."""
    start = {"kind": "process_start", "mode": "ft_launcher", "steps": 4}
    for rank, old, new in ((0, 1, 3), (1, 2, 4)):
        late = rank * 0.1
        events = [
            start | {"t": 0.0, "pid": old},
            {"t": 1.0, "kind": "startup_done", "pid": old, "restored_step": -1, "tier": "none"},
            {"t": 2.0, "kind": "step", "pid": old, "step": 0, "step_s": 1.0},
            {"t": 3.0, "kind": "step", "pid": old, "step": 1, "step_s": 1.0},
        ]
        if rank == 1:
            events.append(
                {
                    "t": 10.0,
                    "kind": "fault_injected",
                    "pid": old,
                    "class": "sigkill",
                    "step": 2,
                    "target_rank": 1,
                    "expected_layer": "ft_launcher",
                }
            )
        else:
            events.append({"t": 10.3, "kind": "terminated", "pid": old, "layer": "ft_launcher"})
        events += [
            start | {"t": 12.0 + late, "pid": new, "created_t": 11.0 + late},
            {"t": 13.0 + 2 * late, "kind": "process_ready", "pid": new},
            {
                "t": 14.0 + late,
                "kind": "startup_done",
                "pid": new,
                "restored_step": 1,
                "load_s": 0.3 + late,
                "tier": "memory",
            },
            {"t": 14.5 + late, "kind": "step", "pid": new, "step": 2, "step_s": 0.5},
            {"t": 15.0 + late, "kind": "step", "pid": new, "step": 3, "step_s": 0.5},
        ]
        _write(tmp_path, rank, events)
    (fault,) = summarize(tmp_path).faults
    assert fault.layer == "ft_launcher"
    assert fault.tier == "memory"
    assert fault.phases is not None
    assert fault.phases.detect_s == pytest.approx(0.3)
    assert fault.phases.teardown_s == pytest.approx(0.0)
    assert fault.phases.start_s == pytest.approx(2.2)  # first creation 11.0 -> last ready 13.2
    assert fault.phases.restore_s == pytest.approx(0.4)
    assert fault.phases.rendezvous_s == pytest.approx(1.2)
    assert fault.phases.first_step_s == pytest.approx(0.5)
    assert fault.phases.total_s == pytest.approx(14.6 - 10.0)


def test_a_different_hash_is_reported_as_not_identical(tmp_path):
    _soft_fault_run(tmp_path)
    assert summary_document(summarize(tmp_path), fault_free_sha256="0" * 64)["bit_identical"] is False
    assert summary_document(summarize(tmp_path), fault_free_sha256=None)["bit_identical"] is False


def test_report_table_and_timeline(tmp_path):
    _soft_fault_run(tmp_path)
    document = summary_document(summarize(tmp_path), fault_free_sha256="f" * 64)
    console = Console(record=True, width=80)  # names stay whole in a default terminal
    print_report(console, document)
    text = console.export_text()
    for needle in (
        "exception",
        "inprocess",
        "training goodput",
        "bit-identical to fault-free",
        "yes",
        "Recovery phases",
        "rdzv",
    ):
        assert needle in text
    wrong = document | {"faults": [document["faults"][0] | {"layer": "ft_launcher"}]}
    print_report(console := Console(record=True, width=80), wrong)
    assert "ft_launcher (not inprocess)" in console.export_text()
    png = plot_timeline(tmp_path, document)
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert width > 500
    assert height > 300


def test_progress_reads_step_phase_and_faults_and_the_loops_own_length(tmp_path):
    """Whatever script runs, the progress bar's total is the length its loop states (`loop_start`)."""
    assert _progress_line(tmp_path) == Progress(0, None, "starting", 0)
    _write(
        tmp_path,
        0,
        [
            {"t": 0.0, "kind": "process_start", "pid": 1},
            {"t": 0.5, "kind": "loop_start", "pid": 1, "attempt": 0, "steps": 6, "first_step": 0},
            {"t": 1.0, "kind": "step", "pid": 1, "step": 2},
            {"t": 2.0, "kind": "fault_injected", "pid": 1, "class": "hang", "target_rank": 1},
        ],
    )
    assert _progress_line(tmp_path) == Progress(3, 6, "fault: hang on rank 1", 1)
    _write(tmp_path, 0, [{"t": 3.0, "kind": "terminated", "pid": 1, "layer": "ft_launcher"}])
    assert _progress_line(tmp_path).phase == "recovering (ft_launcher)"


def test_fault_free_reference_key_ignores_faults_only():
    plain = load_values(LOCAL_VALUES)
    faulty = load_values(LOCAL_VALUES, ["trainer.faults.plan=exception@5:1"])
    longer = load_values(LOCAL_VALUES, [*reference_trainer(steps=99)])
    assert fault_free_key(plain) == fault_free_key(faulty)
    assert fault_free_key(plain) != fault_free_key(longer)
    assert without_faults(faulty).trainer.faults == FaultsConfig()


def test_peer_scenario_values_are_valid_for_every_mode():
    """Each mode's job values pass the chart's and the trainer's own validation."""
    steps = 120
    assert durable_every(steps) == 30
    modes = set()
    for setup in mode_setups(steps=steps, device_step_s=0.5):
        values = load_values(LOCAL_VALUES, (f"mode={setup.mode}", *setup.overrides))
        modes.add(values.mode)
        trainer = values.trainer
        assert trainer.checkpoint.durable_every == 30
        # The scenario itself is the same for every mode: the reference trainer's own args.
        own = parse_args(values.entrypoint.args)
        assert values.entrypoint.module == "nvrx_eks.training"
        assert (own.steps, own.emulated_device_step_s) == (steps, 0.5)
        assert (trainer.faults.count, trainer.faults.seed) == (5, 42)
        assert trainer.faults.weights == {"exception": 0.6, "hang": 0.4}
    assert modes == {"baseline", "inprocess", "ft_launcher", "both"}
    (kit,) = (setup for setup in mode_setups(steps=steps, fault_seed=40) if setup.mode == "both")
    assert "trainer.faults.seed=40" in kit.overrides


def test_the_totals_say_what_they_measure_and_where_a_real_jobs_figures_come_from(tmp_path):
    _soft_fault_run(tmp_path)
    document = summary_document(summarize(tmp_path), fault_free_sha256="f" * 64)
    console = Console(record=True, width=400)
    print_report(console, document, tmp_path)
    text = console.export_text()
    faults = len(document["faults"])
    wall = document["wall_s"]
    assert f"{document['steps']} steps of {document['mean_step_s'] * 1e3:.0f} ms" in text
    assert f"{faults} faults in {wall:.1f} s (one every {wall / faults:.1f} s)" in text
    assert f"`nvrx-eks plan {FLEET_PLAN.relative_to(REPO)} --from {tmp_path}`" in text
    # The same sentences on the report page, and the plan they point at exists and loads.
    page = render_html(document, read_events(tmp_path), title="t", run_dir=tmp_path)
    assert all(html.escape(line) in page for line in totals_in_scale(document, tmp_path))
    assert FLEET_PLAN.is_file()


def test_the_report_names_what_ran_so_two_scripts_reports_are_told_apart(tmp_path):
    _soft_fault_run(tmp_path)
    sizes = {"state_bytes": 4_000_000, "memcpy_gbps": 4.0, "num_parameters": 106816}
    _write(tmp_path, 0, [{"t": 9.0, "kind": "startup_done", "pid": 1, **sizes}])
    ran = {
        "entrypoint": "python -m examples.hf_llama.train --steps 80",
        "values": "k8s/values/local-hf-llama.yaml",
    }
    document = summary_document(summarize(tmp_path), fault_free_sha256="f" * 64, ran=ran)
    console = Console(record=True, width=200)
    print_report(console, document)
    header = console.export_text().splitlines()[0]
    assert header == (
        "ran: python -m examples.hf_llama.train --steps 80; values k8s/values/local-hf-llama.yaml; "
        "106,816 parameters, 4.0 MB of state per rank"
    )
    page = render_html(document, read_events(tmp_path), title="t")
    assert f'<p id="ran">{html.escape(header.removeprefix("ran: "))}</p>' in page
    assert json.loads(write_summary(tmp_path, document).read_text())["ran"] == ran


def test_the_fault_free_key_counts_a_scripts_own_code_not_what_is_vendored_beside_it(tmp_path):
    """A script's folder with a virtual environment, a vendored site-packages and hidden folders: only
    its own Python files are its code."""
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "data.py").write_text("DATA = 1\n")
    for vendored in (
        "vendor/site-packages/big",
        ".venv/lib/python3.11/site-packages/x",
        "env/lib",
        ".git/hooks",
    ):
        (tmp_path / vendored).mkdir(parents=True)
        (tmp_path / vendored / "mod.py").write_text("X = 1\n")
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    script = load_values(HF_VALUES, ["entrypoint.module=null", f"entrypoint.script={tmp_path / 'train.py'}"])
    assert code_files(script) == [tmp_path / "lib" / "data.py", tmp_path / "train.py"]
    key = fault_free_key(script)
    (tmp_path / "vendor" / "site-packages" / "big" / "mod.py").write_text("X = 2\n")
    assert fault_free_key(script) == key
    (tmp_path / "lib" / "data.py").write_text("DATA = 2\n")
    assert fault_free_key(script) != key


def test_the_demo_names_each_claim_its_run_did_not_meet():
    """The console says which claim failed (a fault recovered by the next layer up, a class never
    injected, an unexplained difference), not only that one did."""
    from nvrx_eks.localrun.demo import DEMO_FAULTS, unmet_claims  # noqa: PLC0415

    classes = [item.split("@")[0] for item in DEMO_FAULTS]
    faults = [
        {"class": c, "step": 10 + i, "layer": "inprocess", "expected_layer": "inprocess"}
        for i, c in enumerate(classes)
    ]
    met = {"faults": faults, "bit_identical": True, "numerics": {"explained": None}}
    assert unmet_claims(met, job_succeeded=True) == []
    faults[1] = faults[1] | {"layer": "ft_launcher"}
    unmet = unmet_claims(
        {"faults": faults[:-1], "bit_identical": False, "numerics": {"explained": None}}, job_succeeded=False
    )
    assert unmet == [
        "the chaos Job did not succeed",
        f"{classes[1]} at step 11 was recovered by ft_launcher, not inprocess",
        f"no {classes[-1]} fault was injected",
        "the final parameters differ from the fault-free run's, with no reason found",
    ]
