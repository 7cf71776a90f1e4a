"""Names both charts (cluster objects and jobs) and the local executor agree on.

The cluster chart creates the priority classes; the job chart refers to them by these names. Labels
are derived from the job name here, never typed by hand in a chart.
"""

from __future__ import annotations

from typing import Final

APP = "nvrx-eks"

# Where jobs run and who they run as: the cluster stack creates these (infra/config.py TrainingConfig
# defaults, the Pod Identity association, the PVC) and the job values default to them (k8s/values.py),
# so a default job finds what a default stack made.
TRAINING_NAMESPACE = "training"
TRAINING_SERVICE_ACCOUNT = "nvrx-trainer"
CHECKPOINT_PVC = "fsx-checkpoints"

# Priority classes (cluster chart creates them, job chart uses them). The rendezvous store must
# outrank training pods: if the store is evicted, every agent loses its rendezvous at once.
STORE_PRIORITY_CLASS = "nvrx-rendezvous-store"
STORE_PRIORITY_VALUE = 100_000_000
TRAINING_PRIORITY_CLASS = "nvrx-training"
TRAINING_PRIORITY_VALUE = 1_000_000

# Container port of the rendezvous store (torch TCPStore) and the label that tells the executor
# which rendered objects belong to one job.
STORE_PORT = 29400
STORE_SUFFIX = "-rdzv"
"""The rendezvous store's Deployment and Service: `<job>-rdzv` (the store alert matches the suffix)."""
STORE_IMAGE_TAG_SUFFIX = "-store"
"""`nvrx-eks image push` pushes the store's image (images/store.Dockerfile) to the training image's
repository as `<tag>-store`; `nvrx-eks values` finds it there by that name."""
CLUSTER_CA_CONFIG_MAP = "kube-root-ca.crt"
"""The cluster's CA, which Kubernetes publishes in every namespace under this name: the job chart
projects it beside a service account token, the local executor writes its own API server's CA there."""
COMPONENT_LABEL = "app.kubernetes.io/component"
JOB_LABEL = "nvrx-eks/job"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
"""Set by the Job controller on each of a Job's pods: the Job's UID, one per submission of the job."""

# What every GPU node carries: the GPU node groups set the taint and the labels
# (infra/constructs/gpu_nodegroup.py), the device plugins, the job's pods and the node check tolerate
# the taint and select the label. The key is the NVIDIA device plugin's resource name, the taint the
# plugin's own chart tolerates by default.
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "true"
GPU_TAINT_EFFECT: Final = "NoSchedule"
GPU_NODE_LABEL = "nvrx-eks/gpu"
EFA_NODE_LABEL = "nvrx-eks/efa"
"""`"true"` where the node has EFA devices, `"false"` where not: the EFA device plugin selects it."""

SYSTEM_NODEGROUP = "system"
"""The managed node group the cluster stack creates for add-ons and the rendezvous store; the example
job values select it for the store (`eks.amazonaws.com/nodegroup: system`)."""

# nodeadm (AL2023) assembles every instance-store NVMe disk into one RAID0 array mounted here
# (`localStorage: RAID0`, set by infra/constructs/launch_template.py) and bind-mounts the kubelet's and
# containerd's state and the pod logs onto folders of it: hostPath volumes below it land on local NVMe.
# https://awslabs.github.io/amazon-eks-ami/nodeadm/doc/api/#localstorageoptions
NVME_RAID_ROOT = "/mnt/k8s-disks/0"


def job_labels(job_name: str, component: str) -> dict[str, str]:
    """The standard labels every object of one job carries."""
    return {
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/instance": job_name,
        "app.kubernetes.io/managed-by": "cdk8s",
        COMPONENT_LABEL: component,
        JOB_LABEL: job_name,
    }
