"""The configuration values the kit gives EKS managed add-ons and the DCGM exporter chart.

Plain data, no CDK: infra/addons.py deploys them, and `nvrx-eks preflight` checks each managed
add-on's against the JSON schema EKS publishes for the pinned version (DescribeAddonConfiguration):
CreateAddon rejects configuration values outside that schema, and the stack rolls back.
"""

from __future__ import annotations

from typing import Any

# The VPC CNI's network policy agent enforces the job's NetworkPolicy objects (k8s/): without it
# they are accepted and ignored. https://docs.aws.amazon.com/eks/latest/userguide/cni-network-policy-configure.html
VPC_CNI_CONFIGURATION: dict[str, Any] = {"enableNetworkPolicy": "true"}

# One DCGM host engine per GPU node. The DCGM profiling module (DCGM_FI_PROF_*) can be held by one
# engine per GPU, and three would start: the node monitoring agent's dcgm-server, the dcgm-exporter
# chart's embedded engine and the CloudWatch add-on's exporter. The engine kept is the node monitoring
# agent's: its GPU health checks drive node auto-repair, and the add-on cannot switch it off. So:
# - dcgm-exporter runs no engine of its own: `-r` connects it to that engine, which listens on the
#   node's port 5555 (nv-hostengine -b ALL; aws/eks-node-monitoring-agent#205 and #255 describe it);
#   https://docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgm-exporter.html
DCGM_HOSTENGINE_PORT = 5555
DCGM_EXPORTER_REMOTE_ENGINE: dict[str, Any] = {
    "arguments": [
        "-r",
        f"$(NODE_IP):{DCGM_HOSTENGINE_PORT}",
        "-f",
        "/etc/dcgm-exporter/dcp-metrics-included.csv",
    ],
    "extraEnv": [{"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}],
}
# - the agent's DCGM host engine (the dcgm-server DaemonSet) tolerates no taint by default (chart value
#   dcgmAgent.tolerations: []), so on the kit's tainted GPU nodes it would never run and dcgm-exporter
#   and the node check's `dcgmi diag` would find no engine. One host engine per GPU node is node
#   infrastructure like the agent itself (nodeAgent.tolerations: [operator: Exists]): it tolerates every
#   taint, the kit's GPU taint, the node check's unverified taint and any taint a config adds.
#   https://github.com/aws/eks-node-monitoring-agent/blob/main/charts/eks-node-monitoring-agent/values.yaml
#   https://docs.aws.amazon.com/eks/latest/userguide/node-monitoring-agent-configure.html
NODE_MONITORING_CONFIGURATION: dict[str, Any] = {"dcgmAgent": {"tolerations": [{"operator": "Exists"}]}}
# - the CloudWatch add-on collects no accelerated-compute metrics, so its operator deploys no DCGM
#   exporter (amazon-cloudwatch-agent-operator builds it only when accelerated_compute_metrics is on;
#   the opt-out is in the add-on's documented configuration). Giving agent.config replaces the
#   default one, which also turns Application Signals (and its X-Ray traces) off: the role needs
#   CloudWatchAgentServerPolicy only, not AWSXrayWriteOnlyAccess.
#   https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/install-CloudWatch-Observability-EKS-addon.html
CLOUDWATCH_CONFIGURATION: dict[str, Any] = {
    "agent": {
        "config": {
            "logs": {
                "metrics_collected": {
                    "kubernetes": {"enhanced_container_insights": True, "accelerated_compute_metrics": False}
                }
            }
        }
    }
}


# The configuration values of each EKS managed add-on the kit configures, by add-on name.
MANAGED_ADDON_CONFIGURATION: dict[str, dict[str, Any]] = {
    "vpc-cni": VPC_CNI_CONFIGURATION,
    "eks-node-monitoring-agent": NODE_MONITORING_CONFIGURATION,
    "amazon-cloudwatch-observability": CLOUDWATCH_CONFIGURATION,
}
