"""CLI tables are never cut: printed into a pipe or a file, every cell is whole.

Rich lays out for 80 columns when stdout is no terminal and cut wide tables' cells ("good…",
"youn…"). Every console of the kit comes from `kitcore.console.make_console`, which prints a table at
its natural width there. The demo's and the bench's own runs are piped in tests/demo (slow).
"""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
from pathlib import Path

from rich.table import Table

from nvrx_eks.kitcore.console import make_console
from nvrx_eks.layout import parts

REPO = Path(__file__).resolve().parents[1]
PACKAGES = parts(REPO)  # the kit's folders, as pyproject.toml's package-dir declares them
ELLIPSIS = "…"


def test_every_console_comes_from_the_one_helper():
    """A `Console(...)` made anywhere else would lay tables out for 80 columns in a pipe again."""
    made = []
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path == REPO / "kitcore" / "console.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                    if name == "Console":
                        made.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert made == []


def test_a_wide_table_prints_whole_into_a_file_and_text_keeps_its_width():
    out = io.StringIO()  # not a terminal, as a pipe is not
    console = make_console(file=out)
    table = Table(title="t")
    cells = [f"column {i} with a long figure {i * 1234.5678:.4f}" for i in range(6)]
    for cell in cells:
        table.add_column(cell, no_wrap=True)
    table.add_row(*cells)
    console.print(table)
    console.rule("after")
    text = out.getvalue()
    assert ELLIPSIS not in text
    for cell in cells:
        assert text.count(cell) == 2  # header and row, each whole on its line
    assert console.width == 80  # the table widened its own print only: the rule after it is 80 wide
    assert max(len(line) for line in text.splitlines()[-1:]) == 80


def test_plan_into_a_pipe_cuts_no_cell(nvrx_eks, tmp_path):
    piped = nvrx_eks(
        "plan", "planner/examples/llama3-16k-h100.yaml", "--out", str(tmp_path), timeout=300, piped=True
    )
    assert piped.returncode == 0, piped.stderr[-3000:]
    assert ELLIPSIS not in piped.stdout
    assert "young-daly" in piped.stdout
    assert "Young/Daly" in piped.stdout


_PRINT_TABLES = """
import json, sys
from nvrx_eks.kitcore.console import make_console
from nvrx_eks.bench.peer import comparison_table
from nvrx_eks.localrun.report import print_report
document = json.loads(sys.stdin.read())
console = make_console()
table = comparison_table(document["modes"], steps=400, device_step_s=1.0, fault_seed=50, mix="hardware")
console.print(table)
print_report(console, document["demo"])
"""


def _demo_document() -> dict:
    phases = {
        "detect_s": 2.1,
        "teardown_s": 2.7,
        "rendezvous_s": 3.1,
        "start_s": 1.1,
        "restore_s": 0.1,
        "first_step_s": 0.2,
    }
    faults = [
        {
            "class": cls,
            "step": 10 * i,
            "rank": i % 4,
            "layer": layer,
            "expected_layer": layer,
            "detect_s": 0.1,
            "recovery_s": 6.3,
            "steps_lost": 1,
            "tier": tier,
            "phases": phases,
        }
        for i, (cls, layer, tier) in enumerate(
            [
                ("skip_collective", "inprocess", "memory"),
                ("deadlock", "ft_launcher", "memory"),
                ("node_loss", "job_controller", "peer_memory"),
            ]
        )
    ]
    return {
        "mode": "both",
        "steps": 80,
        "faults": faults,
        "training_goodput": 0.4321,
        "infra_goodput": 0.5678,
        "checkpoint_efficiency": 0.9912,
        "stall_ratio": 12.34,
        "stall_per_checkpoint_s": 0.0123,
        "stall_floor_s": 0.00045,
        "final_params_sha256": "4660e305" * 8,
        "fault_free_params_sha256": "4660e305" * 8,
        "bit_identical": True,
    }


def test_bench_and_demo_tables_into_a_pipe_cut_no_cell():
    row = {
        "completed": True,
        "training_goodput": 0.954,
        "infra_goodput": 0.973,
        "mean_recovery_s": 2.3,
        "steps_lost": 3,
    }
    modes = {name: dict(row) for name in ("baseline", "inprocess", "ft_launcher", "kit")}
    document = {"modes": modes, "demo": _demo_document()}
    done = subprocess.run(
        [sys.executable, "-c", _PRINT_TABLES],
        input=json.dumps(document),
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert ELLIPSIS not in done.stdout
    for whole in (
        "peer goodput*",
        "peer recovery*",
        "95.4%",
        "97.3%",
        "2.3 s",
        "skip_collective",
        "peer_memory",
    ):
        assert whole in done.stdout, whole


def test_an_event_reads_as_one_line_of_its_kind_and_fields_never_a_python_repr():
    from nvrx_eks.training.events import event_line  # noqa: PLC0415

    fields = {"tier": "local", "step": 631, "allowed_steps": 12, "error": "disk full", "at": {"rank": 1}}
    line = event_line("checkpoint_behind", fields)
    assert line == 'checkpoint_behind tier=local step=631 allowed_steps=12 error="disk full" at={"rank":1}'
    assert "'" not in line


def test_the_checkpointers_warnings_read_as_event_lines(caplog):
    from nvrx_eks.training.checkpoint.stats import log_event  # noqa: PLC0415
    from nvrx_eks.training.events import event_line  # noqa: PLC0415

    fields = {"tier": "local", "step": 631, "allowed_steps": 12}
    with caplog.at_level("WARNING", logger="nvrx_eks.training.checkpoint"):
        log_event("checkpoint_behind", fields)
    assert [record.getMessage() for record in caplog.records] == [event_line("checkpoint_behind", fields)]
