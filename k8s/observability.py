"""Where the cluster looks: scrape objects for the trainer and the DCGM exporter, the Grafana dashboard.

- The trainer serves Prometheus text on `metrics.prometheus_port + local rank` (training/metrics.py),
  one port per rank. The job chart names those container ports `metrics-<local rank>`
  (`metrics_ports`) and annotates the pod with the `prometheus.io/*` convention (which can name one
  port: local rank 0's); the PodMonitor below scrapes every rank's port by name.
- The DCGM exporter (infra/addons.py, its own ServiceMonitor off) is scraped by a PodMonitor in its
  namespace, on its container port `metrics`.
- PodMonitor is the Prometheus Operator's CRD: a plain ApiObject, emitted only when asked for (its CRD
  exists only where the operator is installed), like the Kueue objects. So is the PrometheusRule that
  carries the alert rules (k8s/alerts).
- Every trainer series gets the pod's node (`node`) and the job it belongs to (`training_job`, the
  pod's `nvrx-eks/job` label) as target labels: the dashboard joins GPUs and ranks by node, the alerts
  speak of jobs. `scrape_configs` turns a PodMonitor into the scrape configuration the operator
  generates for it, so a plain Prometheus scrapes through the same relabeling (`make observe-check`).
- The dashboard (k8s/dashboards/training.json) ships as a ConfigMap labelled `grafana_dashboard: "1"`,
  which the Grafana chart's dashboard sidecar loads (kube-prometheus-stack's default label); the
  sidecar must watch this namespace (`sidecar.dashboards.searchNamespace: ALL`, or this one).
  https://github.com/grafana/helm-charts/tree/main/charts/grafana#sidecar-for-dashboards
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cdk8s
from cdk8s_plus_33 import k8s
from constructs import Construct

from nvrx_eks.k8s import names
from nvrx_eks.k8s.alerts import rule_groups
from nvrx_eks.kitcore.profiles import PROFILES

if TYPE_CHECKING:
    from nvrx_eks.k8s.values import JobValues

PROMETHEUS_OPERATOR_API = "monitoring.coreos.com/v1"
DASHBOARDS_DIR = Path(__file__).parent / "dashboards"
GRAFANA_DASHBOARD_LABEL = "grafana_dashboard"
METRICS_PORT_PREFIX = "metrics-"
SCRAPE_INTERVAL = "30s"
MAX_LOCAL_RANKS = max(p.workers_per_node for p in PROFILES.values())
"""One PodMonitor endpoint per possible local rank (a port name that no pod has matches nothing)."""
DCGM_EXPORTER_SELECTOR = {"app.kubernetes.io/name": "dcgm-exporter"}
DCGM_EXPORTER_PORT = "metrics"

# What the DCGM exporter exports with its default counters (etc/default-counters.csv of
# NVIDIA/dcgm-exporter, the release infra/cluster_pins.py pins): the dashboard may query only these and the
# trainer's own names. The exporter cannot run here, so this is the one list kept by hand.
DCGM_EXPORTER_METRICS = frozenset(
    {
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    }
)


def metrics_port(values: JobValues) -> int | None:
    """The trainer's `metrics.prometheus_port` in the job values (None: textfiles only, not served)."""
    return values.trainer.metrics.prometheus_port


def metrics_port_name(local_rank: int) -> str:
    return f"{METRICS_PORT_PREFIX}{local_rank}"


def metrics_ports(base_port: int, workers: int) -> list[k8s.ContainerPort]:
    """The trainer container's ports, one per local rank (training/metrics.py: port + local rank)."""
    return [
        k8s.ContainerPort(container_port=base_port + i, name=metrics_port_name(i)) for i in range(workers)
    ]


def scrape_annotations(base_port: int) -> dict[str, str]:
    """The prometheus.io convention: one port per pod, so local rank 0's (the PodMonitor scrapes all)."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(base_port),
        "prometheus.io/path": "/metrics",
    }


def meta_label(kubernetes_label: str) -> str:
    """A pod label's name as Prometheus's Kubernetes discovery writes it: `__meta_kubernetes_pod_label_`
    + the name with every character outside [a-zA-Z0-9_] replaced by `_`."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", kubernetes_label)


NODE_RELABELING = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
"""The node name on every series: the dashboard joins GPUs and ranks by node."""
TARGET_RELABELINGS = [
    NODE_RELABELING,
    # The job a rank belongs to (the label every object of one job carries): the alerts group by it.
    {"sourceLabels": [meta_label(names.JOB_LABEL)], "targetLabel": "training_job"},
]
"""The trainer PodMonitor's relabelings."""


def dashboards() -> dict[str, str]:
    """File name -> JSON text of every dashboard shipped with the kit."""
    return {path.name: path.read_text(encoding="utf-8") for path in sorted(DASHBOARDS_DIR.glob("*.json"))}


class Monitoring(Construct):
    """The dashboards' ConfigMap and, with the Prometheus Operator, the two PodMonitors."""

    def __init__(
        self,
        scope: Construct,
        id: str,  # noqa: A002
        *,
        namespace: str,
        pod_monitors: bool,
        dcgm_namespace: str = "kube-system",
    ) -> None:
        super().__init__(scope, id)
        files = dashboards()
        for text in files.values():
            json.loads(text)  # a broken file fails the synth, not the Grafana sidecar
        k8s.KubeConfigMap(
            self,
            "dashboards",
            metadata=k8s.ObjectMeta(
                name=f"{names.APP}-dashboards",
                namespace=namespace,
                labels={"app.kubernetes.io/name": names.APP, GRAFANA_DASHBOARD_LABEL: "1"},
            ),
            data=files,
        )
        if not pod_monitors:
            return
        rules = cdk8s.ApiObject(
            self,
            "alert-rules",
            api_version=PROMETHEUS_OPERATOR_API,
            kind="PrometheusRule",
            metadata=cdk8s.ApiObjectMetadata(
                name=f"{names.APP}-alerts", namespace=namespace, labels={"app.kubernetes.io/name": names.APP}
            ),
        )
        rules.add_json_patch(cdk8s.JsonPatch.add("/spec", {"groups": rule_groups(namespace)}))
        trainer = {"app.kubernetes.io/name": names.APP, names.COMPONENT_LABEL: "trainer"}
        self._pod_monitor(
            "trainer-pod-monitor",
            name=f"{names.APP}-trainer",
            namespace=namespace,
            selector=trainer,
            ports=[metrics_port_name(i) for i in range(MAX_LOCAL_RANKS)],
            relabelings=TARGET_RELABELINGS,
        )
        self._pod_monitor(
            "dcgm-pod-monitor",
            name=f"{names.APP}-dcgm-exporter",
            namespace=dcgm_namespace,
            selector=DCGM_EXPORTER_SELECTOR,
            ports=[DCGM_EXPORTER_PORT],
            relabelings=[NODE_RELABELING],
        )

    def _pod_monitor(
        self,
        id: str,  # noqa: A002 - the construct id
        *,
        name: str,
        namespace: str,
        selector: dict[str, str],
        ports: list[str],
        relabelings: list[dict[str, Any]],
    ) -> None:
        monitor = cdk8s.ApiObject(
            self,
            id,
            api_version=PROMETHEUS_OPERATOR_API,
            kind="PodMonitor",
            metadata=cdk8s.ApiObjectMetadata(
                name=name, namespace=namespace, labels={"app.kubernetes.io/name": names.APP}
            ),
        )
        monitor.add_json_patch(
            cdk8s.JsonPatch.add(
                "/spec",
                {
                    "selector": {"matchLabels": selector},
                    "namespaceSelector": {"matchNames": [namespace]},
                    "podMetricsEndpoints": [
                        {
                            "port": port,
                            "path": "/metrics",
                            "interval": SCRAPE_INTERVAL,
                            "relabelings": relabelings,
                        }
                        for port in ports
                    ],
                },
            )
        )


def monitoring_objects(namespace: str) -> list[dict[str, Any]]:
    """The objects `Monitoring` renders with the Prometheus Operator on (ConfigMap, PrometheusRule,
    PodMonitors), as the cluster chart emits them."""
    app = cdk8s.App()
    chart = cdk8s.Chart(app, "monitoring")
    Monitoring(chart, "monitoring", namespace=namespace, pod_monitors=True)
    return list(chart.to_json())


def _relabel(rule: dict[str, Any]) -> dict[str, Any]:
    """A PodMonitor relabeling (camelCase) as a Prometheus relabel_config (snake_case)."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {keys.get(k, k): v for k, v in rule.items()}


def scrape_configs(pod_monitor: dict[str, Any], *, interval: str | None = None) -> list[dict[str, Any]]:
    """The scrape configurations the Prometheus Operator generates for `pod_monitor`, one per endpoint,
    without the service discovery (the caller adds `kubernetes_sd_configs`, or targets carrying the
    same `__meta_kubernetes_*` labels). `interval` overrides the endpoints' scrape interval.

    As the operator writes them: drop finished pods, keep the pods the selector matches (label value
    and presence) in the selected namespaces and the container port the endpoint names, set
    `namespace`, `container`, `pod`, `job` (`<namespace>/<name>`) and `endpoint`, then the endpoint's
    own relabelings. https://github.com/prometheus-operator/prometheus-operator/blob/main/pkg/prometheus/promcfg.go
    """
    meta, spec = pod_monitor["metadata"], pod_monitor["spec"]
    selected = spec.get("namespaceSelector", {}).get("matchNames", [meta["namespace"]])
    keep_pods: list[dict[str, Any]] = [
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"action": "keep", "source_labels": ["__meta_kubernetes_namespace"], "regex": "|".join(selected)},
    ]
    for key, value in spec["selector"]["matchLabels"].items():
        present = meta_label(key).replace("_pod_label_", "_pod_labelpresent_", 1)
        keep_pods.append(
            {"action": "keep", "source_labels": [meta_label(key), present], "regex": f"({value});true"}
        )
    configs = []
    for index, endpoint in enumerate(spec["podMetricsEndpoints"]):
        port = endpoint["port"]
        relabel = [
            *keep_pods,
            {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
            {"target_label": "endpoint", "replacement": port},
            *(_relabel(r) for r in endpoint.get("relabelings", [])),
        ]
        configs.append(
            {
                "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{index}",
                "honor_labels": bool(endpoint.get("honorLabels", False)),
                "metrics_path": endpoint.get("path", "/metrics"),
                "scrape_interval": interval or endpoint.get("interval", SCRAPE_INTERVAL),
                "relabel_configs": relabel,
            }
        )
    return configs
