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

from nvrx_eks.kitcore.configio import load_model
from nvrx_eks.layout import parts
from nvrx_eks.localrun.report import PHASE_COLUMNS, PHASE_NAMES
from nvrx_eks.localrun.summary import FaultPhases
from nvrx_eks.planner.config import Plan, fault_kind
from nvrx_eks.planner.model import route
from nvrx_eks.training.metrics import RECOVERY_PHASES
from nvrx_eks.training.resilience.modes import FAULT_CLASSES, Mode, layers, recovering_layer
from nvrx_eks.training.resilience.modes import MODES as MODES_NAMES

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
    "the local image's name": (r"^LOCAL_IMAGE\b.*=", "k8s/nvrx_versions.py"),
    "the default cluster config": (r"^DEFAULT_CONFIG\b.*=", "infra/__init__.py"),
    "the default job values": (r"^DEFAULT_VALUES\b.*=", "k8s/__init__.py"),
    # None: a file the kit ships is found beside its package (a home above), never from the working
    # folder, so the CLI runs from any folder.
    "a kit file relative to the working folder": (r'Path\("(?:k8s|infra|planner|images)/', None),
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


@pytest.mark.parametrize("mode", MODES_NAMES)
def test_the_planner_routes_each_fault_to_the_layer_the_trainer_expects(mode: Mode) -> None:
    """The meaning, not only the name: for every fault class, the layer the planner projects a recovery
    through is the one the trainer's runs are judged by (training/resilience/modes.py)."""
    plan = load_model(Plan, ROOT / "planner" / "examples" / "peer-16-h100.yaml")
    in_job = layers(mode).launcher == "ft_launcher"
    by_trainer_layer = {"inprocess": "inprocess", "ft_launcher": "ft_launcher", "torchrun": "job_restart"}
    for cls in FAULT_CLASSES:
        expected = recovering_layer(cls, mode)
        planned = route(plan, mode, fault_kind(cls)).layer
        if expected == "job_controller":
            assert planned == (
                "store_restart" if cls == "store_loss" else "node_swap" if in_job else "job_restart"
            )
        else:
            assert planned == by_trainer_layer[expected], (cls, mode)
