"""`make observe-check`: a real Prometheus scrapes the local job's ranks through the PodMonitor's
relabeling, every dashboard query returns data, promtool passes the alert rules' unit tests.

Needs Debian's prometheus (`apt-get install -y prometheus`, which .ci/run does); skips, saying so,
where it is not installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from nvrx_eks.bench import observe
from nvrx_eks.k8s.alerts import RULES_TEST
from nvrx_eks.k8s.observability import dashboards
from nvrx_eks.kitcore.console import make_console
from nvrx_eks.localrun.executor import LocalJob

REPO = Path(__file__).resolve().parents[2]
MISSING = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(bool(MISSING), reason=f"{' and '.join(MISSING)} not installed: {observe.INSTALL_HINT}")
def test_make_observe_check_scrapes_every_rank_and_every_query_returns_data():
    done = subprocess.run(
        ["make", "observe-check"], cwd=REPO, capture_output=True, text=True, timeout=580, check=False
    )
    out = done.stdout
    assert done.returncode == 0, out[-6000:] + done.stderr[-3000:]
    queries = [q for text in dashboards().values() for _, q in observe.dashboard_queries(json.loads(text))]
    trainer = [q for q in queries if not observe.needs_gpu(q)]
    assert len(trainer) > 20
    assert f"{len(trainer)}/{len(trainer)} dashboard queries returned data" in out
    assert f"({len(queries) - len(trainer)} more read the DCGM exporter" in out
    tests = sum(len(t["alert_rule_test"]) for t in yaml.safe_load(RULES_TEST.read_text())["tests"])
    assert f"promtool: {tests} rule tests passed" in out
    # Every pod of the run, the node-loss replacement included, scraped with its node and job labels.
    scraped = re.search(r"scraped (\d+) rank targets of (\d+) pods", out)
    assert scraped, out[-3000:]
    assert (int(scraped.group(1)), int(scraped.group(2))) == (6, 3)
    assert "each with its node and training_job" in out
    assert re.search(r"(\d+)/\1 alert rules evaluated on the scraped series without error", out)


def test_without_prometheus_it_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    assert observe.observe_check(console=make_console()) == 2
    assert "apt-get install -y prometheus" in capsys.readouterr().out


def test_grafana_variables_become_this_runs_values():
    expr = 'sum(increase(y{namespace=~"$namespace"}[$__range])) / rate(x[$__rate_interval])'
    assert observe.grafana_expr(expr, namespace="training", range_s=90, rate_interval_s=4) == (
        'sum(increase(y{namespace=~"training"}[90s])) / rate(x[4s])'
    )
    assert observe.needs_gpu("avg(DCGM_FI_DEV_GPU_UTIL)")
    assert not observe.needs_gpu("avg(trainer_loss)")


def test_a_local_pod_ip_is_its_nodes_loopback_address():
    """As the executor maps `<job>-<i>.<svc>`: the address a rank binds is the one discovery names."""
    assert LocalJob._field_ref("status.podIP", {}, 1) == "127.0.0.3"
    assert LocalJob._field_ref("status.podIP", {}, None) == "127.0.0.1"
