"""The alert rules: shipped as a PrometheusRule with the PodMonitors, every rule unit-tested by promtool
on series shaped like the ones the trainer and the PodMonitor produce, and the scrape configuration a
plain Prometheus uses derived from the PodMonitor itself.

promtool is Debian's (`apt-get install -y prometheus`); the tests that run it skip, saying so, without it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import promql_parser
import pytest
import yaml

from nvrx_eks.bench.observe import prometheus_config, run_promtool_tests
from nvrx_eks.k8s import alerts
from nvrx_eks.k8s.observability import TARGET_RELABELINGS, monitoring_objects, scrape_configs
from nvrx_eks.training.metrics import Metrics

NAMESPACE = "training"
needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="needs promtool: apt-get install -y prometheus (Debian's package ships it)",
)


@pytest.fixture(scope="module")
def trainer_series(tmp_path_factory) -> dict[str, tuple[str, ...]]:
    metrics = Metrics(run_dir=tmp_path_factory.mktemp("m"), rank=0, every=1, port=None, local_rank=0)
    return metrics.series_labels()


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return monitoring_objects(NAMESPACE)


def _one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


def _trainer_monitor(docs: list[dict]) -> dict:
    return _one(docs, "PodMonitor", "nvrx-eks-trainer")


def _target_labels(pod_monitor: dict) -> set[str]:
    """The labels a scraped trainer series gets from its target: the relabelings' targets + instance."""
    (config, *_) = scrape_configs(pod_monitor)
    return {r["target_label"] for r in config["relabel_configs"] if "target_label" in r} | {"instance"}


def test_the_cluster_chart_ships_the_rules_with_the_pod_monitors(cluster_objects):
    docs = cluster_objects(pod_monitors=True)
    rule = _one(docs, "PrometheusRule", "nvrx-eks-alerts")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["spec"]["groups"] == alerts.rule_groups(NAMESPACE)
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert names == {
        "TrainingGoodputLow",
        "TrainingRecoveryStorm",
        "CheckpointTierStale",
        "NodeUnverified",
        "TrainingWaitingForCapacity",
        "RendezvousStoreUnavailable",
        "TrainingJobShrunk",
    }
    assert "PrometheusRule" not in {d["kind"] for d in cluster_objects(pod_monitors=False)}


def test_every_rule_reads_only_series_that_exist_by_labels_they_carry(objects, trainer_series):
    known = set(trainer_series) | set(alerts.EXTERNAL_METRICS)
    target = _target_labels(_trainer_monitor(objects))
    for group in _one(objects, "PrometheusRule")["spec"]["groups"]:
        for rule in group["rules"]:
            used: dict[str, set[str]] = {}

            def visit(node, used=used) -> None:
                if isinstance(node, promql_parser.VectorSelector):
                    used.setdefault(node.name, set()).update(m.name for m in node.matchers.matchers)

            promql_parser.walk(promql_parser.parse(rule["expr"]), visit)
            assert set(used) <= known, rule["alert"]
            for name, labels in used.items():
                carried = set(alerts.EXTERNAL_METRICS.get(name, ())) or set(trainer_series[name]) | target
                assert labels <= carried, (rule["alert"], name, labels - carried)
            for grouping in re.findall(r"by \(([^)]*)\)", rule["expr"]):
                labels = {g.strip() for g in grouping.split(",")}
                carried = set().union(*(set(alerts.EXTERNAL_METRICS.get(n, ())) for n in used)) | target
                carried |= set().union(*(set(trainer_series.get(n, ())) for n in used))
                assert labels <= carried, (rule["alert"], labels - carried)


def test_each_rule_has_a_quiet_and_a_firing_unit_test_on_real_series_shapes(objects, trainer_series):
    document = yaml.safe_load(alerts.RULES_TEST.read_text())
    assert document["rule_files"] == [alerts.RULES_FILE]
    target = _target_labels(_trainer_monitor(objects))
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in document["tests"]:
        for case in test["alert_rule_test"]:
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
        for item in test["input_series"]:
            parsed = promql_parser.parse(item["series"])
            labels = {m.name for m in parsed.matchers.matchers}
            if parsed.name in alerts.EXTERNAL_METRICS:
                assert labels <= alerts.EXTERNAL_METRICS[parsed.name], item["series"]
            else:
                # The trainer's own series: its labels and the PodMonitor's target labels, all of them.
                assert parsed.name in trainer_series, item["series"]
                assert labels == set(trainer_series[parsed.name]) | target, item["series"]
    names = {r.name for r in alerts.alert_rules(NAMESPACE)}
    assert firing == names
    assert quiet == names


@needs_promtool
def test_promtool_passes_the_rules_and_fails_a_broken_one(tmp_path):
    rules = {"groups": alerts.rule_groups(NAMESPACE)}
    passed, tests, output = run_promtool_tests(rules, tmp_path / "good")
    assert passed, output
    assert tests == sum(
        len(t["alert_rule_test"]) for t in yaml.safe_load(alerts.RULES_TEST.read_text())["tests"]
    )
    # The tests can fail: a storm threshold ten times higher misses the storm they describe.
    broken = yaml.safe_load(yaml.safe_dump(rules))
    for rule in broken["groups"][0]["rules"]:
        if rule["alert"] == "TrainingRecoveryStorm":
            rule["expr"] = rule["expr"].replace(
                f"> {alerts.RECOVERY_STORM}", f"> {10 * alerts.RECOVERY_STORM}"
            )
    passed, _, output = run_promtool_tests(broken, tmp_path / "broken")
    assert not passed
    assert "TrainingRecoveryStorm" in output


def test_the_scrape_configuration_is_derived_from_the_pod_monitor(objects):
    monitor = _trainer_monitor(objects)
    configs = scrape_configs(monitor, interval="1s")
    assert len(configs) == len(monitor["spec"]["podMetricsEndpoints"])
    for config, endpoint in zip(configs, monitor["spec"]["podMetricsEndpoints"], strict=True):
        relabel = config["relabel_configs"]
        assert {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": endpoint["port"]} in relabel  # fmt: skip
        own = [
            {"source_labels": r["sourceLabels"], "target_label": r["targetLabel"]} for r in TARGET_RELABELINGS
        ]
        assert relabel[-len(own) :] == own
        assert config["scrape_interval"] == "1s"
        assert config["metrics_path"] == endpoint["path"]
    # Derived, not copied: a relabeling added to the PodMonitor is in the scrape configuration.
    extra = {"sourceLabels": ["__meta_kubernetes_pod_label_team"], "targetLabel": "team"}
    changed = yaml.safe_load(yaml.safe_dump(monitor))
    changed["spec"]["podMetricsEndpoints"][0]["relabelings"].append(extra)
    assert scrape_configs(changed)[0]["relabel_configs"][-1] == {
        "source_labels": ["__meta_kubernetes_pod_label_team"],
        "target_label": "team",
    }
    assert {"target_label": "job", "replacement": f"{NAMESPACE}/nvrx-eks-trainer"} in configs[0][
        "relabel_configs"
    ]


def test_the_pod_monitor_selects_the_pods_the_job_chart_renders(objects, tmp_path):
    from nvrx_eks.k8s.job_chart import render  # noqa: PLC0415
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415

    root = Path(__file__).resolve().parents[2]
    files = render(load_values(root / "k8s" / "values" / "p5-2.yaml"), str(tmp_path))
    (job,) = [d for f in files for d in yaml.safe_load_all(Path(f).read_text()) if d and d["kind"] == "Job"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    monitor = _trainer_monitor(objects)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # The label the alerts group jobs by is one every trainer pod carries.
    (training_job,) = [r for r in TARGET_RELABELINGS if r["targetLabel"] == "training_job"]
    (source,) = training_job["sourceLabels"]
    assert any(source == f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}" for k in labels)
    # Each rank serves on the pod's own address, the one Kubernetes discovery scrapes.
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (pod_ip,) = [e for e in container["env"] if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


@needs_promtool
def test_promtool_accepts_the_prometheus_configuration(objects, tmp_path):
    config = prometheus_config(_trainer_monitor(objects), tmp_path / "targets.json")
    (tmp_path / "targets.json").write_text("[]")
    (tmp_path / "alerts.rules.yaml").write_text(yaml.safe_dump({"groups": alerts.rule_groups(NAMESPACE)}))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    done = subprocess.run(
        ["promtool", "check", "config", "prometheus.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
