"""Where the cluster looks: scrape objects for the trainer and the DCGM exporter, the Grafana dashboard.

- The trainer serves Prometheus text on `metrics.prometheus_port + local rank` (training/metrics.py),
  one port per rank. The job chart names those container ports `metrics-<local rank>`
  (`metrics_ports`) and annotates the pod with the `prometheus.io/*` convention (which can name one
  port: local rank 0's); the PodMonitor below scrapes every rank's port by name.
- The DCGM exporter (infra/addons.py, its own ServiceMonitor off) is scraped by a PodMonitor in its
  namespace, on its container port `metrics`.
- PodMonitor is the Prometheus Operator's CRD: a plain ApiObject, emitted only when asked for (its CRD
  exists only where the operator is installed), like the Kueue objects.
- The dashboard (k8s/dashboards/training.json) ships as a ConfigMap labelled `grafana_dashboard: "1"`,
  which the Grafana chart's dashboard sidecar loads (kube-prometheus-stack's default label); the
  sidecar must watch this namespace (`sidecar.dashboards.searchNamespace: ALL`, or this one).
  https://github.com/grafana/helm-charts/tree/main/charts/grafana#sidecar-for-dashboards
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import cdk8s
from cdk8s_plus_33 import k8s
from constructs import Construct

from k8s import names
from kitcore.profiles import PROFILES

if TYPE_CHECKING:
    from k8s.values import JobValues

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
# NVIDIA/dcgm-exporter, the release kitcore/pins.py pins): the dashboard may query only these and the
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
    metrics = values.trainer.get("metrics")
    port = metrics.get("prometheus_port") if isinstance(metrics, dict) else None
    return int(port) if port is not None else None


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
        trainer = {"app.kubernetes.io/name": names.APP, names.COMPONENT_LABEL: "trainer"}
        self._pod_monitor(
            "trainer-pod-monitor",
            name=f"{names.APP}-trainer",
            namespace=namespace,
            selector=trainer,
            ports=[metrics_port_name(i) for i in range(MAX_LOCAL_RANKS)],
        )
        self._pod_monitor(
            "dcgm-pod-monitor",
            name=f"{names.APP}-dcgm-exporter",
            namespace=dcgm_namespace,
            selector=DCGM_EXPORTER_SELECTOR,
            ports=[DCGM_EXPORTER_PORT],
        )

    def _pod_monitor(
        self,
        id: str,  # noqa: A002 - the construct id
        *,
        name: str,
        namespace: str,
        selector: dict[str, str],
        ports: list[str],
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
                    # The node name on every series: the dashboard joins GPUs and ranks by node.
                    "podMetricsEndpoints": [
                        {
                            "port": port,
                            "path": "/metrics",
                            "interval": SCRAPE_INTERVAL,
                            "relabelings": [
                                {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
                            ],
                        }
                        for port in ports
                    ],
                },
            )
        )
