"""The shipped Grafana dashboard queries only metrics the trainer or the DCGM exporter export.

The trainer's names come from a real `training.metrics.Metrics` registry (every family it declares,
with the suffixes its type exposes), so renaming a metric in the trainer fails this test until the
dashboard follows. Every query is parsed by a PromQL parser, not matched by a regular expression.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest

from nvrx_eks.k8s.observability import DCGM_EXPORTER_METRICS, dashboards
from nvrx_eks.training.metrics import Metrics

# Grafana's variables, replaced by values of their kind before parsing.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "1h", "$__interval": "1m"}
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<query>.+),\s*)?(?P<label>\w+)\)$")


def _queries(dashboard: dict[str, Any]) -> list[str]:
    found = []

    def panels(items: list[dict[str, Any]]) -> None:
        for panel in items:
            found.extend(t["expr"] for t in panel.get("targets", []) if t.get("expr"))
            panels(panel.get("panels", []))

    panels(dashboard["panels"])
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if variable.get("type") == "query":
            text = query["query"] if isinstance(query, dict) else query
            match = _LABEL_VALUES.match(text)
            assert match, f"unsupported variable query {text!r}"
            if match.group("query"):
                found.append(match.group("query"))
    return found


def metric_names(query: str) -> set[str]:
    """Every metric a PromQL query selects (by name or by a __name__ matcher)."""
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    query = re.sub(r"\$\{?\w+\}?", ".*", query)  # dashboard variables: label matchers' values
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            names.update(m.value for m in node.matchers.matchers if m.name == "__name__")

    promql_parser.walk(promql_parser.parse(query), visit)
    return names


def unknown_metrics(queries: list[str], known: set[str]) -> dict[str, set[str]]:
    return {q: missing for q in queries if (missing := metric_names(q) - known)}


@pytest.fixture(scope="module")
def trainer_names(tmp_path_factory) -> set[str]:
    metrics = Metrics(run_dir=tmp_path_factory.mktemp("m"), rank=0, every=1, port=None, local_rank=0)
    return metrics.metric_names()


@pytest.fixture(scope="module")
def shipped() -> dict[str, dict[str, Any]]:
    files = dashboards()
    assert "training.json" in files
    return {name: json.loads(text) for name, text in files.items()}


def test_every_query_uses_only_exported_metrics(shipped, trainer_names):
    known = trainer_names | DCGM_EXPORTER_METRICS
    for name, dashboard in shipped.items():
        queries = _queries(dashboard)
        assert len(queries) > 20, name
        assert unknown_metrics(queries, known) == {}, name


def test_the_check_catches_a_renamed_metric(trainer_names):
    known = trainer_names | DCGM_EXPORTER_METRICS
    old_name = 'sum(rate(trainer_checkpoint_stall_seconds{namespace=~"$namespace"}[$__rate_interval]))'
    assert unknown_metrics([old_name], known) == {old_name: {"trainer_checkpoint_stall_seconds"}}
    assert unknown_metrics(['{__name__="DCGM_FI_PROF_GR_ENGINE_ACTIVE"}'], known)


def test_dashboard_covers_what_a_platform_team_asks(shipped):
    used = set().union(*(metric_names(q) for q in _queries(shipped["training.json"])))
    assert used >= {
        "trainer_productive_step_seconds_total",  # goodput
        "trainer_step_seconds_bucket",  # step time
        "trainer_tokens_total",  # throughput
        "trainer_recoveries_total",  # recoveries by layer
        "trainer_recovery_phase_seconds_sum",  # their phases
        "trainer_checkpoint_stall_seconds_total",
        "trainer_checkpoint_last_success_timestamp_seconds",  # age per tier
        "trainer_launcher_restarts",
        "DCGM_FI_DEV_GPU_UTIL",
    }
    titles = [p["title"] for p in shipped["training.json"]["panels"]]
    assert len(titles) == len(set(titles))
    ids = [p["id"] for p in shipped["training.json"]["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_file_is_what_the_package_ships():
    root = Path(__file__).resolve().parents[2]
    assert (root / "k8s" / "dashboards" / "training.json").is_file()
    assert '"*.json"' in (root / "pyproject.toml").read_text()  # package data: shipped with the kit
