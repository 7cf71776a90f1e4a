"""Each concept the kit shares between its parts is defined in one module and imported everywhere else.

A second definition drifts from the first (a mode the planner spells differently, a phase the report
names apart from the trainer, a probe measured two ways): each pattern below is a definition's
signature, and only its home may contain it.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from nvrx_eks.layout import parts
from nvrx_eks.localrun.report import PHASE_COLUMNS, PHASE_NAMES
from nvrx_eks.localrun.summary import FaultPhases
from nvrx_eks.training.metrics import RECOVERY_PHASES

ROOT = Path(__file__).resolve().parents[1]
PARTS = (*parts(ROOT), "tools")  # the kit's folders, as pyproject.toml's package-dir declares them

FLOOR = "training/checkpoint/floor.py"
MODES = "training/resilience/modes.py"
_NAME = "(?:baseline|inprocess|ft_launcher|both)"
_MODE_TEST = (
    rf'mode\)?\s*(?:==|!=)\s*"|\bmode\s+(?:not\s+)?in\s+[{{(\[]\s*"{_NAME}"'
    rf'|[{{(\[]\s*"{_NAME}",\s*"{_NAME}"'
)
CHECKPOINT_CONFIG = "training/checkpoint/config.py"
METRICS = "training/metrics.py"
HOMES: dict[str, tuple[str, str | None]] = {
    "the resilience mode": (r'Literal\[\s*"baseline"', MODES),
    # What a mode runs is asked of training/resilience/modes.py `layers`, never spelled as the names
    # that run a layer: a set of mode names, or a mode compared with one (`mode in {"inprocess", "both"}`).
    "what a mode runs": (
        _MODE_TEST,
        MODES,
    ),
    "the fault classes": (r'Literal\[\s*"exception"', MODES),
    "the fault-plan grammar": (r"@\(\?P<step>", "training/resilience/config.py"),
    "the checkpoint tiers in order": (
        r'=\s*(?:Literal)?[(\[]\s*"memory",\s*"(?:peer_memory|local)"',
        CHECKPOINT_CONFIG,
    ),
    # None: a checkpoint cadence's default is a number in CheckpointConfig's fields, read from there.
    "a checkpoint cadence's default": (r"DEFAULT_\w*EVERY\w*\s*(?::\s*int)?\s*=\s*\d", None),
    "the recovery phases": (
        r'[(\[]\s*"(?:detect|teardown)",\s*"(?:teardown|rendezvous|process_start)"',
        METRICS,
    ),
    "the host-memory copy probe": (r"def (?:\w*memcpy\w*|\w*copy_bandwidth)\(", FLOOR),
    "a state's snapshot bytes": (r"^def state_bytes\(", FLOOR),
    # The trainer's flags are spelled once, by its parser's module; the chart asks it for them.
    "a trainer flag's spelling": (r'"--"\s*\+\s*"-"\.join', "training/config.py"),
    # None: the job values' trainer section is a typed config, never read as raw keys.
    "the trainer section read as raw keys": (r"\.trainer(?:\.get\(|\[|\.items\(\))", None),
    "peer replicas against the nodes": (r"keeps copies on other nodes", CHECKPOINT_CONFIG),
    "a fault's rank against the world size": (
        r"pick a rank below the world size",
        "training/resilience/config.py",
    ),
}


def _sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text()
        for part in PARTS
        for path in sorted((ROOT / part).rglob("*.py"))
    }


@pytest.mark.parametrize("concept", sorted(HOMES))
def test_a_concept_is_defined_in_its_home_only(concept: str) -> None:
    pattern, home = HOMES[concept]
    found = sorted(path for path, text in _sources().items() if re.search(pattern, text, re.MULTILINE))
    assert found == ([] if home is None else [home]), (
        f"{concept}: defined in {found}, its one home is {home or 'CheckpointConfig'}: import it from there"
    )


def test_the_report_names_the_recovery_phases_of_the_summary() -> None:
    phases = [f"{phase}_s" for phase in RECOVERY_PHASES]
    assert [field.name for field in fields(FaultPhases)] == phases
    assert list(PHASE_NAMES) == [column for column, _ in PHASE_COLUMNS] == phases
