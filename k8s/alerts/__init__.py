"""Alert rules for training on the cluster, shipped as a PrometheusRule beside the PodMonitors.

What a platform team is paged for, each rule on the series that says it first:

- training goodput dropping: the ranks' `rate(trainer_productive_step_seconds_total)` (the share of
  wall time spent in steps trained for the first time), averaged over the job;
- a recovery storm: rank 0's recoveries (every recovery restarts rank 0 too) in a window;
- a checkpoint tier older than twice its interval: the steps since the tier's newest checkpoint over
  its interval in steps (`trainer_checkpoint_interval_steps`, the job's `*_every`);
- a node tainted unverified by the node check (`nvrx-eks/unverified`), from kube-state-metrics;
- a job waiting for capacity: unschedulable pods in the training namespace (kube-state-metrics) or
  workloads pending in a Kueue ClusterQueue;
- the rendezvous store unreachable: its Deployment has no ready replica (its readiness probe is the
  store's TCP port, so ready is reachable), from kube-state-metrics;
- a job that has trained below its full size for JOB_SHRUNK_FOR (the job values' `shrink`: a lost
  node's replacement still not scheduled): the ranks' `trainer_world_size` against
  `trainer_full_world_size`.

Every rule has a `promtool test rules` unit test in rules_test.yaml, on series shaped like the ones the
trainer and the PodMonitor produce (tests/k8s/test_k8s_alerts.py checks the shapes; `make
observe-check` runs promtool). The trainer's series carry the PodMonitor's target labels
(k8s/observability.py): `namespace`, `pod`, `node` and `training_job`, the pod's `nvrx-eks/job` label.

kube-prometheus-stack's Prometheus selects PrometheusRules and PodMonitors by its release label unless
`ruleSelectorNilUsesHelmValues` / `podMonitorSelectorNilUsesHelmValues` are false:
https://github.com/prometheus-community/helm-charts/tree/main/charts/kube-prometheus-stack
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvrx_eks.k8s import names
from nvrx_eks.training.node import nodecheck

RULES_TEST = Path(__file__).parent / "rules_test.yaml"
"""promtool's unit tests of every rule; its `rule_files` entry names RULES_FILE in the same folder."""
RULES_FILE = "alerts.rules.yaml"

GOODPUT_BELOW = 0.85
"""Training goodput under this for GOODPUT_FOR pages: at scale the kit holds 95% and more
(docs/measurements.md, `make bench`)."""
GOODPUT_FOR = "15m"
"""As long as the rate's window: a counter's first window reads low while it fills (the rate divides
by the whole window), below GOODPUT_BELOW for window x GOODPUT_BELOW / goodput, shorter than the
window whenever the goodput is above the threshold, so a healthy job's start never fires."""
RECOVERY_STORM = 5
"""More recoveries than this in RECOVERY_WINDOW: faults faster than the job can make progress."""
RECOVERY_WINDOW = "30m"
CHECKPOINT_STALE_INTERVALS = 2
CAPACITY_WAIT_FOR = "10m"
STORE_DOWN_FOR = "1m"
JOB_SHRUNK_FOR = "1h"
"""A job shrunk this long: its lost node's capacity has not come back (a Capacity Block's or ODCR's
hardware replacement takes hours); someone should look at the reservation."""

# Series the rules read that kube-state-metrics and Kueue export (the trainer's own names are checked
# against its registry by the tests).
# https://github.com/kubernetes/kube-state-metrics/blob/main/docs/metrics/cluster/node-metrics.md
# https://github.com/kubernetes/kube-state-metrics/blob/main/docs/metrics/workload/pod-metrics.md
# https://github.com/kubernetes/kube-state-metrics/blob/main/docs/metrics/workload/deployment-metrics.md
# https://kueue.sigs.k8s.io/docs/reference/metrics/
EXTERNAL_METRICS = {
    "kube_node_spec_taint": frozenset({"node", "key", "value", "effect"}),
    "kube_pod_status_unschedulable": frozenset({"namespace", "pod", "uid"}),
    "kube_deployment_status_replicas_available": frozenset({"namespace", "deployment"}),
    "kueue_pending_workloads": frozenset({"cluster_queue", "status"}),
}


@dataclass(frozen=True)
class AlertRule:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    """Templated with the alert's labels only ({{ $labels.x }}): the unit tests compare it whole."""

    def to_rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0m":
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity}
        rule["annotations"] = {"summary": self.summary}
        return rule


def alert_rules(namespace: str) -> list[AlertRule]:
    """Every rule; `namespace` is the training namespace (the kube-state-metrics rules' scope)."""
    job = "{{ $labels.namespace }}/{{ $labels.training_job }}"
    return [
        AlertRule(
            "TrainingGoodputLow",
            # The best rank: every rank of a synchronous job trains the same steps, and a replacement
            # pod's young series would read low while its window fills.
            "max by (namespace, training_job) "
            f"(rate(trainer_productive_step_seconds_total[{GOODPUT_FOR}])) < {GOODPUT_BELOW}",
            GOODPUT_FOR,
            "warning",
            f"{job}: training goodput below {GOODPUT_BELOW:.0%} for {GOODPUT_FOR}",
        ),
        AlertRule(
            "TrainingRecoveryStorm",
            "sum by (namespace, training_job) "
            f'(increase(trainer_recoveries_total{{rank="0"}}[{RECOVERY_WINDOW}])) > {RECOVERY_STORM}',
            "0m",
            "critical",
            f"{job}: more than {RECOVERY_STORM} recoveries in {RECOVERY_WINDOW}",
        ),
        AlertRule(
            "CheckpointTierStale",
            # Steps since the tier's newest checkpoint, in intervals of the tier, worst rank per tier.
            "max by (namespace, training_job, tier) ((trainer_last_completed_step - ignoring(tier) "
            "group_right trainer_checkpoint_last_step) / trainer_checkpoint_interval_steps) "
            f"> {CHECKPOINT_STALE_INTERVALS}",
            "5m",
            "warning",
            f"{job}: newest {{{{ $labels.tier }}}} checkpoint older than "
            f"{CHECKPOINT_STALE_INTERVALS} intervals",
        ),
        AlertRule(
            "NodeUnverified",
            f'max by (node, value) (kube_node_spec_taint{{key="{nodecheck.UNVERIFIED_TAINT}"}}) > 0',
            "5m",
            "warning",
            f"node {{{{ $labels.node }}}} tainted {nodecheck.UNVERIFIED_TAINT}={{{{ $labels.value }}}}: "
            "no training pod goes there",
        ),
        AlertRule(
            "TrainingWaitingForCapacity",
            f'sum by (namespace) (kube_pod_status_unschedulable{{namespace="{namespace}"}}) > 0 '
            "or sum by (cluster_queue) (kueue_pending_workloads) > 0",
            CAPACITY_WAIT_FOR,
            "warning",
            "training waiting for capacity for "
            f"{CAPACITY_WAIT_FOR}: {{{{ $labels.namespace }}}}{{{{ $labels.cluster_queue }}}}",
        ),
        AlertRule(
            "RendezvousStoreUnavailable",
            "kube_deployment_status_replicas_available"
            f'{{namespace="{namespace}", deployment=~".+{names.STORE_SUFFIX}"}} < 1',
            STORE_DOWN_FOR,
            "critical",
            "{{ $labels.namespace }}/{{ $labels.deployment }}: no ready rendezvous store; "
            "no restart can rendezvous",
        ),
        AlertRule(
            "TrainingJobShrunk",
            # Over 5 minutes: a restart while shrunk leaves the ranks' series out for a scrape or two,
            # which would otherwise reset the alert's pending time.
            "max by (namespace, training_job) "
            "(max_over_time((trainer_full_world_size - trainer_world_size)[5m:1m])) > 0",
            JOB_SHRUNK_FOR,
            "warning",
            f"{job}: training below its full size for {JOB_SHRUNK_FOR}: a lost node's replacement is "
            "still not scheduled",
        ),
    ]


def rule_groups(namespace: str) -> list[dict[str, Any]]:
    """The PrometheusRule's `spec.groups` (and a rule file's `groups`, the same schema)."""
    return [{"name": f"{names.APP}-training", "rules": [r.to_rule() for r in alert_rules(namespace)]}]
