"""The training job as a cdk8s chart: rendezvous store, headless Service, Indexed Job.

Composed from keyword-only constructs; labels are derived from the job name (k8s/names.py). Why each
setting is what it is:

- Indexed Job, completions = parallelism = nodes + spares: one pod per node with a stable index and
  hostname `<job>-<index>` (the index is not the node rank: ranks come from the rendezvous, and with
  spares any index may be the one waiting); with `subdomain` set to the headless Service,
  `<job>-<index>.<job>` resolves to that pod (https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode).
- restartPolicy Never + backoffLimitPerIndex: a failed pod is replaced by the Job controller, per index,
  up to the budget; maxFailedIndexes 0 fails the job as soon as one index is out of budget.
- podReplacementPolicy Failed: a replacement starts only once its predecessor has fully terminated, so
  two pods of one index never rendezvous at once.
- podFailurePolicy: exit code 2 (a configuration error: bad flags, bad values, the self-check's
  config/image verdict) and NVRx's no-restart exit (a rank's bad input or a bug in the training script:
  every launcher stops without a restart) fail the Job at once; the self-check's exit 75 (node problem)
  and a pod with the DisruptionTarget condition (node drained, preempted, deleted) are ignored: replaced
  without consuming the index's budget (https://kubernetes.io/docs/tasks/job/pod-failure-policy/). A
  node problem that a second node reports too is the configuration's, which no replacement cures: the
  self-check compares them in the job's rendezvous store and exits 2 (training/node/repeats.py). So is
  a collateral stop: the trainer container's exit COLLATERAL_EXIT_CODE (training/resilience/launch.py)
  says every rank of the pod was only stopped by its launcher after a rank elsewhere failed; that rank's
  pod exits otherwise and is charged, so the budget still bounds the replacements.
- Init containers: `python -m nvrx_eks.training.node.selfcheck` (can this node train?), then, with the peer
  replica,
  `python -m nvrx_eks.training.node.topology` (the node's zone and network nodes, for the partners:
  `topology_init`).
- Host RAM (checkpoint tier 1) is a memory-backed emptyDir of the pod, sized from the profile.
- The rendezvous store is its own Deployment + Service running NVRx's control process (k8s/launcher.py),
  on the system nodes with a priority class above training pods: no training pod hosts the store, so
  losing any node leaves the others running. When the launchers close the rendezvous for good (the
  job's restart budget spent, or training done), the control process exits and the Deployment restarts
  it with an empty store: the Job's replacement pods then start a fresh rendezvous.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import cdk8s
from cdk8s_plus_33 import k8s
from constructs import Construct

from nvrx_eks.k8s import names
from nvrx_eks.k8s.env import container_env
from nvrx_eks.k8s.launcher import control_command, launcher_command
from nvrx_eks.k8s.nvrx_versions import LOCAL_IMAGE
from nvrx_eks.k8s.observability import metrics_port, metrics_ports, scrape_annotations
from nvrx_eks.k8s.rank_config import resilience_env
from nvrx_eks.k8s.values import ALLOCATABLE_FRACTION
from nvrx_eks.kitcore.configio import USER_ERROR_EXIT_CODE, UserError
from nvrx_eks.kitcore.pins import TRAINER_UID
from nvrx_eks.training.checkpoint.domains import (
    DOMAIN_LABELS,
    FAILURE_DOMAIN_ENV,
    TOPOLOGY_FILE_ENV,
    ZONE_LABEL,
)
from nvrx_eks.training.metrics import METRICS_HOST_ENV
from nvrx_eks.training.node.kubeapi import SA_DIR
from nvrx_eks.training.node.nodecheck import VERIFIED_LABEL
from nvrx_eks.training.node.selfcheck import NODE_PROBLEM_EXIT_CODE
from nvrx_eks.training.node.topology import NODE_NAME_ENV
from nvrx_eks.training.resilience.config import RUN_ID_ENV
from nvrx_eks.training.resilience.launch import COLLATERAL_EXIT_CODE, NO_RESTART_EXIT_CODE
from nvrx_eks.training.resilience.shrink import SHRINK_ENV

if TYPE_CHECKING:
    from nvrx_eks.k8s.values import JobValues

TRAINER_CONTAINER = "trainer"
STORE_CONTAINER = "store"
NODE_RANK_ENV = "NODE_RANK"
SELFCHECK_CONTAINER = "selfcheck"
STORE_TMP = "/tmp"  # noqa: S108 - the store's own emptyDir, mounted there


def store_service_name(values: JobValues) -> str:
    return f"{values.name}{names.STORE_SUFFIX}"


def headless_service_name(values: JobValues) -> str:
    return values.name


def store_endpoint(values: JobValues) -> str:
    return f"{store_service_name(values)}:{names.STORE_PORT}"


def node_address(values: JobValues) -> str:
    """This pod's stable DNS name, with the index filled in by Kubernetes ($(VAR) expansion)."""
    return f"{values.name}-$({NODE_RANK_ENV}).{headless_service_name(values)}"


def _image(values: JobValues) -> tuple[str, str]:
    # `local` is never pulled: the local executor runs the command with this machine's virtualenv.
    return values.image, "Never" if values.image == LOCAL_IMAGE else "IfNotPresent"


def _store_image(values: JobValues) -> tuple[str, str]:
    """The store's own small image (k8s/values.py store_image), or `local` with the job's."""
    if values.image == LOCAL_IMAGE or values.store_image is None:
        return LOCAL_IMAGE, "Never"
    return values.store_image, "IfNotPresent"


COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
INFRA_RANK_ENV = "GROUP_RANK"
"""NVRx's per-node identity in the barrier rendezvous (its `get_infrastructure_rank`: SLURM variables,
else GROUP_RANK). A restart round with hot spares waits `rdzv_last_call_s` for the previous active nodes
by this identity; with none set NVRx disables that wait, and a spare could take the place of a node whose
launcher is only restarting its workers. The pod's index is stable across those restarts, and a lost
node's replacement pod keeps it. ft_launcher sets the workers' own GROUP_RANK (their node rank)."""


def _node_name_env() -> k8s.EnvVar:
    node_name = k8s.EnvVarSource(field_ref=k8s.ObjectFieldSelector(field_path="spec.nodeName"))
    return k8s.EnvVar(name=NODE_NAME_ENV, value_from=node_name)


def _index_env() -> list[k8s.EnvVar]:
    # The Job controller also sets JOB_COMPLETION_INDEX; NODE_RANK names it for $(VAR) expansion in args.
    index = k8s.EnvVarSource(field_ref=k8s.ObjectFieldSelector(field_path=COMPLETION_INDEX_FIELD))
    return [
        k8s.EnvVar(name=NODE_RANK_ENV, value_from=index),
        k8s.EnvVar(name=INFRA_RANK_ENV, value_from=index),
    ]


FAILURE_DOMAIN_LABELS = DOMAIN_LABELS
"""The node labels whose values are each pod's failure domain for the peer replica's partners, coarsest
first: the zone, then EKS's `topology.k8s.aws/network-node-layer-N` (training/checkpoint/domains.py). The
partners alternate at the coarsest of them where the job's nodes differ (training/checkpoint/replica.py
`node_ring`): zones where the job spans zones, and inside one zone (a p5 job's, for EFA) the network
nodes, so one switch's failure does not take a node and its partner together.

Kubernetes' PodTopologyLabels admission plugin (KEP-4742: alpha in 1.33, beta and on by default in
1.35) copies only the node's zone and region onto each pod bound to it, so the downward API reads the
zone (`_failure_domain_env`) and not the layers: the pod's topology init container reads the rest from
its own Node (`topology_init`). Where that fails, the zone alone is the domain; a cluster without the
plugin leaves the zone empty too, and then every node is in one domain and the partners are the next
nodes in rank order."""
FAILURE_DOMAIN_ANNOTATION = "nvrx-eks.io/peer-failure-domain-labels"
"""On the pod template: the labels the peer replica's failure domains come from, coarsest first."""


def _failure_domain_env() -> k8s.EnvVar:
    label = k8s.ObjectFieldSelector(field_path=f"metadata.labels['{ZONE_LABEL}']")
    return k8s.EnvVar(name=FAILURE_DOMAIN_ENV, value_from=k8s.EnvVarSource(field_ref=label))


def _run_id_env() -> k8s.EnvVar:
    # One identity per run of the job, shared by its pods and kept by a lost node's replacement: the Job's
    # UID. The ranks key what belongs to one run by it (training/run_scope.py).
    uid = k8s.ObjectFieldSelector(field_path=f"metadata.labels['{names.JOB_UID_LABEL}']")
    return k8s.EnvVar(name=RUN_ID_ENV, value_from=k8s.EnvVarSource(field_ref=uid))


def _pod_ip_env() -> k8s.EnvVar:
    # The ranks serve /metrics on the pod's own address (the address a PodMonitor scrapes), which also
    # keeps two local pods' ranks apart (the local executor gives each "node" its loopback address).
    return k8s.EnvVar(
        name=METRICS_HOST_ENV,
        value_from=k8s.EnvVarSource(field_ref=k8s.ObjectFieldSelector(field_path="status.podIP")),
    )


# Unprivileged user for the containers that need no root (the rendezvous store): `nobody`.
NONROOT_UID = 65534
RUNTIME_DEFAULT_SECCOMP = k8s.SeccompProfile(type="RuntimeDefault")
OWNER_SETUP_CONTAINER = "own-dirs"
SCRATCH_VOLUME = "scratch"
SCRATCH_PATH = "/tmp"  # noqa: S108 - the pod's own emptyDir, mounted there
# The trainer's /tmp and $HOME: ft_launcher's and NVRx's sockets and files, Triton/TorchInductor kernel
# caches, CUDA's JIT cache (~/.nv). On the node's disk, bounded so a runaway cache evicts the pod rather
# than filling the disk kubelet and containerd share.
SCRATCH_LIMIT = "16Gi"


def _locked_down(uid: int, *, keep: list[str] | None = None) -> k8s.SecurityContext:
    """A container as `uid` (user and group) that cannot gain privileges: every capability dropped but
    `keep`, no privilege escalation, a read-only root filesystem, the runtime's default seccomp filter."""
    return k8s.SecurityContext(
        run_as_non_root=uid != 0,
        run_as_user=uid,
        run_as_group=uid,
        allow_privilege_escalation=False,
        read_only_root_filesystem=True,
        capabilities=k8s.Capabilities(drop=["ALL"], add=keep),
        seccomp_profile=RUNTIME_DEFAULT_SECCOMP,
    )


def nonroot_security() -> k8s.SecurityContext:
    """Pod Security `restricted` for a container that writes nothing: non-root, no capabilities,
    no privilege escalation, a read-only root filesystem, the runtime's default seccomp filter."""
    return _locked_down(NONROOT_UID)


def trainer_security() -> k8s.SecurityContext:
    """The trainer's and the self-check's container: Pod Security `restricted`, as the trainer's uid.

    Non-root with no capability at all, EFA profiles included. RDMA memory registration (libfabric's EFA
    provider, NCCL) is bounded by RLIMIT_MEMLOCK unless the process holds CAP_IPC_LOCK, and adding
    IPC_LOCK could not help here: a capability added for a non-root process never reaches its
    effective set (Kubernetes sets no ambient capabilities:
    https://github.com/kubernetes/kubernetes/issues/56374). The limit is the container runtime's: the
    GPU nodes' NodeConfig raises RLIMIT_MEMLOCK in containerd's base runtime spec on EFA profiles
    (infra/constructs/launch_template.py), as AL2023's default spec sets only RLIMIT_NOFILE.
    The root filesystem is read-only: the trainer writes only to its mounts (the scratch /tmp, which
    is also $HOME, /dev/shm, the checkpoint tiers, the run folder).
    """
    return _locked_down(TRAINER_UID)


def owner_setup_security() -> k8s.SecurityContext:
    """The one container that runs as root: it hands root-owned folders to the trainer's uid.

    uid 0 because the folders' owner is root: the kubelet creates a hostPath folder root-owned (fsGroup
    does not apply to hostPath volumes) and the FSx file system's root belongs to root. CHOWN is the
    only capability it keeps: `chown` to another uid needs it; creating the folders does not (uid 0 owns
    their parents). Without DAC_OVERRIDE or FOWNER it cannot read, write or change the mode of anything
    it does not own. No privilege escalation, a read-only root filesystem, the default seccomp filter.
    """
    return _locked_down(0, keep=["CHOWN"])


def owner_setup_container(
    *, image: str, pull: str, folders: list[str], mounts: list[k8s.VolumeMount]
) -> k8s.Container:
    """Create `folders` and give them (not what is inside: that is the trainer's already) to TRAINER_UID."""
    owner = f"{TRAINER_UID}:{TRAINER_UID}"
    return k8s.Container(
        name=OWNER_SETUP_CONTAINER,
        image=image,
        image_pull_policy=pull,
        command=["sh", "-c", f'mkdir -p -- "$@" && chown -- {owner} "$@"', OWNER_SETUP_CONTAINER, *folders],
        volume_mounts=mounts,
        resources=k8s.ResourceRequirements(
            requests={"cpu": k8s.Quantity.from_string("100m"), "memory": k8s.Quantity.from_string("64Mi")},
            limits={"memory": k8s.Quantity.from_string("64Mi")},
        ),
        security_context=owner_setup_security(),
    )


def trainer_owned_folders(values: JobValues) -> list[str]:
    """The folders the trainer writes on volumes whose root belongs to root: the node-local tier on the
    NVMe hostPath, the durable tier and the run folder on FSx (the emptyDirs are world-writable)."""
    config = values.trainer
    return [str(d) for d in (config.checkpoint.local_dir, config.checkpoint.durable_dir, config.run_dir) if d]


TOPOLOGY_CONTAINER = "topology"
TOPOLOGY_VOLUME = "topology"
TOPOLOGY_DIR = "/var/run/nvrx-eks/topology"
TOPOLOGY_FILE = f"{TOPOLOGY_DIR}/node.json"
NODE_READER_TOKEN_VOLUME = "node-reader-token"  # noqa: S105 - a volume name, not a secret
NODE_READER_TOKEN_S = 600
"""The token's lifetime: the least the API server issues; the container reads the Node once at start."""


def topology_init(*, image: str, pull: str) -> tuple[k8s.Container, list[k8s.Volume], k8s.VolumeMount]:
    """The trainer pod's topology init container, its two volumes, and the trainer's read-only mount of
    the file it writes (`python -m nvrx_eks.training.node.topology`, training/node/topology.py).

    The network-node labels are on the Node only, and reading a Node takes the API. Why this way:
    - An init container, not the trainer: the token exists only while it runs, in its own mount
      (the pod keeps automountServiceAccountToken false), so the trainer, which runs the job's code for
      days, holds no credential for the API at all.
    - Its own Node, read once: `get` on nodes is the whole grant (the cluster chart's ClusterRole, no
      list or watch); a webhook that copies the labels onto pods, or a controller that labels them,
      would be a cluster component with wider rights, in the path of every pod's creation.
    - Not the EC2 API (DescribeInstanceTopology): an IAM permission and a call per pod, with the
      instance's id from the metadata service, which the job's network policy keeps out of reach.
    The token is a bound one: it expires in NODE_READER_TOKEN_S and dies with the pod. Only this
    container mounts it, and its uid can read it either way the kubelet writes it: mode 0644 (the
    projected volume's default) where the pod's containers run as different uids, 0600 owned by the
    one uid where they all share it. It never fails the pod (training/node/topology.py): a job whose
    service account the cluster chart did not bind reads no labels, logs why, and falls back to the zone.
    """
    token = k8s.Volume(
        name=NODE_READER_TOKEN_VOLUME,
        projected=k8s.ProjectedVolumeSource(
            sources=[
                k8s.VolumeProjection(
                    service_account_token=k8s.ServiceAccountTokenProjection(
                        path="token", expiration_seconds=NODE_READER_TOKEN_S
                    )
                ),
                k8s.VolumeProjection(
                    config_map=k8s.ConfigMapProjection(
                        name=names.CLUSTER_CA_CONFIG_MAP, items=[k8s.KeyToPath(key="ca.crt", path="ca.crt")]
                    )
                ),
            ]
        ),
    )
    # A file of a few hundred bytes: on the node's disk, bounded.
    written = k8s.Volume(
        name=TOPOLOGY_VOLUME, empty_dir=k8s.EmptyDirVolumeSource(size_limit=k8s.Quantity.from_string("1Mi"))
    )
    node_name = k8s.EnvVarSource(field_ref=k8s.ObjectFieldSelector(field_path="spec.nodeName"))
    container = k8s.Container(
        name=TOPOLOGY_CONTAINER,
        image=image,
        image_pull_policy=pull,
        command=[
            "python",
            "-m",
            "nvrx_eks.training.node.topology",
            f"--out={TOPOLOGY_FILE}",
            f"--token-dir={SA_DIR}",
        ],
        env=[k8s.EnvVar(name=NODE_NAME_ENV, value_from=node_name)],
        volume_mounts=[
            k8s.VolumeMount(name=TOPOLOGY_VOLUME, mount_path=TOPOLOGY_DIR),
            k8s.VolumeMount(name=NODE_READER_TOKEN_VOLUME, mount_path=str(SA_DIR), read_only=True),
        ],
        resources=k8s.ResourceRequirements(
            requests={"cpu": k8s.Quantity.from_string("100m"), "memory": k8s.Quantity.from_string("128Mi")},
            limits={"memory": k8s.Quantity.from_string("128Mi")},
        ),
        security_context=trainer_security(),
    )
    return (
        container,
        [token, written],
        k8s.VolumeMount(name=TOPOLOGY_VOLUME, mount_path=TOPOLOGY_DIR, read_only=True),
    )


def store_container(values: JobValues, *, image: str, pull: str, port: int) -> k8s.Container:
    """The store pod's one container: NVRx's control process serving the TCPStore on `port`."""
    return k8s.Container(
        name=STORE_CONTAINER,
        image=image,
        image_pull_policy=pull,
        command=control_command(values, port=port),
        ports=[k8s.ContainerPort(container_port=port, name="rdzv")],
        readiness_probe=k8s.Probe(
            tcp_socket=k8s.TcpSocketAction(port=k8s.IntOrString.from_number(port)),
            period_seconds=5,
        ),
        resources=k8s.ResourceRequirements(
            requests={
                "cpu": k8s.Quantity.from_string("250m"),
                "memory": k8s.Quantity.from_string("512Mi"),
            },
            limits={"memory": k8s.Quantity.from_string("1Gi")},
        ),
        # Pod Security `restricted`: the store needs no root and writes nothing but temporary files
        # (the /tmp emptyDir of its pod).
        security_context=nonroot_security(),
        env=[
            k8s.EnvVar(name="HOME", value=STORE_TMP),
            k8s.EnvVar(name="TMPDIR", value=STORE_TMP),
            # The store closes each restart round: with `shrink`, below the full size when a lost node's
            # replacement stays away (training/resilience/control.py).
            *(
                [k8s.EnvVar(name=SHRINK_ENV, value=values.trainer.shrink.model_dump_json())]
                if values.trainer.shrink.enabled
                else []
            ),
        ],
        volume_mounts=[k8s.VolumeMount(name="tmp", mount_path=STORE_TMP)],
    )


class RendezvousStore(Construct):
    """One-replica Deployment running NVRx's control process (the job's TCPStore and rendezvous
    coordinator), and the headless Service whose name resolves to its pod."""

    def __init__(self, scope: Construct, id: str, *, values: JobValues) -> None:  # noqa: A002
        super().__init__(scope, id)
        labels = names.job_labels(values.name, "rendezvous-store")
        image, pull = _store_image(values)
        port = names.STORE_PORT
        # The service account, the Deployment and the Service share one name: the store's host name.
        name = store_service_name(values)
        meta = k8s.ObjectMeta(name=name, namespace=values.namespace, labels=labels)
        # Its own account: the training service account carries the checkpoint role (Pod Identity)
        # and `get nodes`; the store calls neither AWS nor the Kubernetes API.
        k8s.KubeServiceAccount(
            self,
            "account",
            metadata=meta,
            automount_service_account_token=False,
        )
        k8s.KubeDeployment(
            self,
            "deployment",
            metadata=meta,
            spec=k8s.DeploymentSpec(
                replicas=1,
                # The store is in memory: never run two (agents would split between them).
                strategy=k8s.DeploymentStrategy(type="Recreate"),
                selector=k8s.LabelSelector(match_labels=labels),
                template=k8s.PodTemplateSpec(
                    metadata=k8s.ObjectMeta(labels=labels),
                    spec=k8s.PodSpec(
                        priority_class_name=values.store_priority_class,
                        node_selector=values.system_node_selector or None,
                        service_account_name=name,
                        automount_service_account_token=False,
                        containers=[store_container(values, image=image, pull=pull, port=port)],
                        security_context=k8s.PodSecurityContext(
                            run_as_non_root=True, seccomp_profile=RUNTIME_DEFAULT_SECCOMP
                        ),
                        volumes=[
                            k8s.Volume(
                                name="tmp",
                                empty_dir=k8s.EmptyDirVolumeSource(
                                    size_limit=k8s.Quantity.from_string("64Mi")
                                ),
                            )
                        ],
                    ),
                ),
            ),
        )
        # Headless: the launchers reach the store at its pod IP, not through a ClusterIP. The job's
        # egress rule admits the job's own pods by label (JobNetworkPolicies), and the store carries that
        # label too, so the rule selects its own source pods; the VPC CNI's policy engine then drops
        # egress to a ClusterIP Service whose backends that self-referencing rule selects, while it
        # admits the same backend at its pod IP
        # (https://github.com/aws/amazon-network-policy-controller-k8s/issues/236). A pod IP is what
        # every policy engine matches a podSelector against, so the rule holds wherever it is enforced.
        # Only a ready store is named (no publishNotReadyAddresses): a launcher that resolves the name
        # reaches a store that listens; the Recreate strategy keeps that one pod.
        k8s.KubeService(
            self,
            "service",
            metadata=meta,
            spec=k8s.ServiceSpec(
                cluster_ip="None",
                selector=labels,
                # A headless Service forwards nothing: port = targetPort = the container's port.
                ports=[
                    k8s.ServicePort(name="rdzv", port=port, target_port=k8s.IntOrString.from_number(port))
                ],
            ),
        )


class NodesService(Construct):
    """Headless Service: gives every training pod the stable name `<job>-<index>.<job>`."""

    def __init__(self, scope: Construct, id: str, *, values: JobValues) -> None:  # noqa: A002
        super().__init__(scope, id)
        k8s.KubeService(
            self,
            "service",
            metadata=k8s.ObjectMeta(
                name=headless_service_name(values),
                namespace=values.namespace,
                labels=names.job_labels(values.name, "nodes"),
            ),
            spec=k8s.ServiceSpec(
                cluster_ip="None",
                selector={"batch.kubernetes.io/job-name": values.name},
                # Names must resolve while pods start (rendezvous happens before anything is "ready").
                publish_not_ready_addresses=True,
            ),
        )


# EKS Pod Identity agent (node-local, link-local addresses): where the AWS SDKs in the trainer get
# the job's IAM credentials (https://docs.aws.amazon.com/eks/latest/userguide/pod-id-how-it-works.html).
POD_IDENTITY_AGENT_CIDRS = ("169.254.170.23/32", "fd00:ec2::23/128")
DNS_PORT = 53
HTTPS_PORT = 443
# Why the trainers' HTTPS egress names no addresses, written on the policy itself.
HTTPS_ANYWHERE_ANNOTATION = "nvrx-eks.io/https-egress-to-any-address"
HTTPS_ANYWHERE_WHY = (
    "S3 (the durable checkpoint tier) answers from the public addresses of its regional prefix list, "
    "which change and which a NetworkPolicy cannot name (the VPC's gateway endpoint routes them "
    "privately, by route table, not by address); the API server's addresses are the endpoint's ENIs. "
    "So TCP 443 is open to any address for the trainer pods only, and nothing else is: no other port, "
    "and the store has no egress beyond the job's pods and DNS"
)


def policy_port(number: int, protocol: str = "TCP") -> k8s.NetworkPolicyPort:
    return k8s.NetworkPolicyPort(port=k8s.IntOrString.from_number(number), protocol=protocol)


def dns_egress() -> k8s.NetworkPolicyEgressRule:
    """Out to the cluster's DNS pods (CoreDNS in kube-system, labelled k8s-app=kube-dns on EKS), over
    UDP and TCP (a large answer is retried over TCP)."""
    kube_dns = k8s.NetworkPolicyPeer(
        namespace_selector=k8s.LabelSelector(match_labels={"kubernetes.io/metadata.name": "kube-system"}),
        pod_selector=k8s.LabelSelector(match_labels={"k8s-app": "kube-dns"}),
    )
    return k8s.NetworkPolicyEgressRule(
        to=[kube_dns], ports=[policy_port(DNS_PORT, "UDP"), policy_port(DNS_PORT)]
    )


def network_policy(
    scope: Construct,
    id: str,  # noqa: A002
    *,
    metadata: k8s.ObjectMeta,
    pod_selector: k8s.LabelSelector,
    ingress: list[k8s.NetworkPolicyIngressRule] | None = None,
    egress: list[k8s.NetworkPolicyEgressRule] | None = None,
) -> None:
    """A NetworkPolicy that governs each direction given rules (an empty list: nothing in that direction)
    and leaves a direction given None to the other policies that select the pods."""
    k8s.KubeNetworkPolicy(
        scope,
        id,
        metadata=metadata,
        spec=k8s.NetworkPolicySpec(
            pod_selector=pod_selector,
            policy_types=[
                kind for kind, rules in (("Ingress", ingress), ("Egress", egress)) if rules is not None
            ],
            ingress=ingress,
            egress=egress,
        ),
    )


class JobNetworkPolicies(Construct):
    """Only the job's own pods reach the job's pods; they reach each other, DNS, and AWS over HTTPS.

    The rendezvous TCPStore, ft_launcher's c10d store, NVRx's in-process store and the gloo/NCCL
    bootstrap sockets are unauthenticated and listen on all interfaces (some on ephemeral ports), so
    the rule is by pod, not by port: ingress only from pods carrying this job's label, in this
    namespace. Egress of every job pod: the job's pods and cluster DNS. The trainer pods also reach the
    Pod Identity agent and TCP 443 (S3 for the durable tier, and the API server for the topology init
    container, `topology_init`); the store reaches nothing else. The node's instance metadata service
    (169.254.169.254:80, the node role's credentials) is out of everyone's reach. EFA traffic (RDMA
    through libfabric) bypasses the kernel's IP stack and is not subject to these rules.

    Enforced only where the cluster runs a network policy engine: the VPC CNI's network policy agent
    (add-on setting `enableNetworkPolicy`, turned on by the cluster stack). It admits the node's own
    address, so the kubelet's probes still reach the store (aws/aws-network-policy-agent#56).
    """

    def __init__(self, scope: Construct, id: str, *, values: JobValues) -> None:  # noqa: A002
        super().__init__(scope, id)
        job_pods = k8s.LabelSelector(match_labels={names.JOB_LABEL: values.name})
        from_job = k8s.NetworkPolicyPeer(pod_selector=job_pods)
        labels = names.job_labels(values.name, "network-policy")

        def meta(kind: str, **annotations: str) -> k8s.ObjectMeta:
            name = f"{values.name}-{kind}"
            return k8s.ObjectMeta(
                name=name, namespace=values.namespace, labels=labels, annotations=annotations or None
            )

        network_policy(
            self,
            "ingress",
            metadata=meta("ingress"),
            pod_selector=job_pods,
            ingress=[k8s.NetworkPolicyIngressRule(from_=[from_job]), *self._metrics_rule(values)],
        )
        network_policy(
            self,
            "egress",
            metadata=meta("egress"),
            pod_selector=job_pods,
            egress=[k8s.NetworkPolicyEgressRule(to=[from_job]), dns_egress()],
        )
        trainers = k8s.LabelSelector(
            match_labels={names.JOB_LABEL: values.name, names.COMPONENT_LABEL: "trainer"}
        )
        pod_identity_agent = [
            k8s.NetworkPolicyPeer(ip_block=k8s.IpBlock(cidr=c)) for c in POD_IDENTITY_AGENT_CIDRS
        ]
        network_policy(
            self,
            "https",
            metadata=meta("https", **{HTTPS_ANYWHERE_ANNOTATION: HTTPS_ANYWHERE_WHY}),
            pod_selector=trainers,
            egress=[
                k8s.NetworkPolicyEgressRule(to=pod_identity_agent, ports=[policy_port(80)]),
                k8s.NetworkPolicyEgressRule(ports=[policy_port(HTTPS_PORT)]),
            ],
        )

    @staticmethod
    def _metrics_rule(values: JobValues) -> list[k8s.NetworkPolicyIngressRule]:
        """With trainer.metrics.prometheus_port set, scrapers anywhere in the cluster may reach the
        ranks' /metrics ports (port + local rank), and nothing else of the pod."""
        first = metrics_port(values)
        if not first:
            return []
        last = first + values.profile.workers_per_node - 1
        return [
            k8s.NetworkPolicyIngressRule(
                from_=[k8s.NetworkPolicyPeer(namespace_selector=k8s.LabelSelector())],
                ports=[
                    k8s.NetworkPolicyPort(
                        port=k8s.IntOrString.from_number(first), end_port=last, protocol="TCP"
                    )
                ],
            )
        ]


MEMORY_TIER_VOLUME = "checkpoint-memory"


def _volumes(values: JobValues) -> tuple[list[k8s.Volume], list[k8s.VolumeMount]]:
    s = values.storage

    def in_ram(name: str, gib: int) -> k8s.Volume:
        size = k8s.Quantity.from_string(f"{gib}Gi")
        return k8s.Volume(name=name, empty_dir=k8s.EmptyDirVolumeSource(medium="Memory", size_limit=size))

    volumes = [
        k8s.Volume(
            name="fsx",
            persistent_volume_claim=k8s.PersistentVolumeClaimVolumeSource(claim_name=s.fsx_pvc),
        ),
        in_ram("shm", values.shm_gib),
        # Tier 1 (host RAM) is the pod's own tmpfs: launcher restarts inside the pod restore from it;
        # a replacement pod starts empty, as a new node would (the node's /dev/shm is never shared).
        in_ram(MEMORY_TIER_VOLUME, values.memory_tier_gib),
    ]
    mounts = [
        k8s.VolumeMount(name="fsx", mount_path=s.fsx_mount_path),
        k8s.VolumeMount(name="shm", mount_path="/dev/shm"),  # noqa: S108 - the pod's shared memory, not a temp file
        k8s.VolumeMount(name=MEMORY_TIER_VOLUME, mount_path=s.memory_mount_path),
    ]
    if values.image != LOCAL_IMAGE:
        # The container's /tmp on its read-only root filesystem. `image: local` has none to replace: the
        # local executor gives each pod a temporary folder of its own (TMPDIR) and runs it as this
        # machine's user, with that user's home.
        volumes.append(
            k8s.Volume(
                name=SCRATCH_VOLUME,
                empty_dir=k8s.EmptyDirVolumeSource(size_limit=k8s.Quantity.from_string(SCRATCH_LIMIT)),
            )
        )
        mounts.append(k8s.VolumeMount(name=SCRATCH_VOLUME, mount_path=SCRATCH_PATH))
    if s.local_nvme_path:
        # A folder of our own below the NVMe array (never its root, which holds the kubelet's and
        # containerd's state: k8s/values.py refuses it), created on first use.
        volumes.append(
            k8s.Volume(
                name="local-nvme",
                host_path=k8s.HostPathVolumeSource(path=s.local_nvme_path, type="DirectoryOrCreate"),
            )
        )
        mounts.append(k8s.VolumeMount(name="local-nvme", mount_path=s.local_mount_path))
    return volumes, mounts


def _resources(values: JobValues) -> k8s.ResourceRequirements:
    p = values.profile
    cpu = max(1, int(p.vcpus * ALLOCATABLE_FRACTION))
    memory = k8s.Quantity.from_string(f"{values.pod_memory_gib}Gi")
    requests = {"cpu": k8s.Quantity.from_number(cpu), "memory": memory}
    # No CPU limit (throttling a rank stalls every rank); memory limit = request (no overcommit).
    limits = {"memory": memory}
    for key, count in (("nvidia.com/gpu", p.gpus), ("vpc.amazonaws.com/efa", p.efa_devices)):
        if count:
            # Extended resources: request must equal limit.
            requests[key] = limits[key] = k8s.Quantity.from_number(count)
    return k8s.ResourceRequirements(requests=requests, limits=limits)


SELFCHECK_COMMAND = ("python", "-m", "nvrx_eks.training.node.selfcheck")
"""The pod's self-check, which proves among its checks that the ranks' checkpointer can start on the
node: it reads the job's configuration from NVRX_EKS_CONFIG, in the env it shares with the ranks."""


def selfcheck_command(values: JobValues) -> list[str]:
    """SELFCHECK_COMMAND with `--store`: the job's rendezvous store, where each pod's node problems are
    compared with the other nodes' (training/node/repeats.py)."""
    return [*SELFCHECK_COMMAND, f"--store={store_endpoint(values)}"]


def _failure_policy() -> k8s.PodFailurePolicy:
    """First matching rule wins (https://kubernetes.io/docs/tasks/job/pod-failure-policy/)."""
    return k8s.PodFailurePolicy(
        rules=[
            # A configuration error from any of our containers (the self-check's verdict, the
            # launcher's argument parser), or NVRx's decision that the job must not restart (a rank's
            # bad input or the same bug twice, training/resilience/nvrx_compat.py `stop_on_user_error`):
            # every pod would fail alike.
            k8s.PodFailurePolicyRule(
                action="FailJob",
                on_exit_codes=k8s.PodFailurePolicyOnExitCodesRequirement(
                    operator="In", values=[USER_ERROR_EXIT_CODE, NO_RESTART_EXIT_CODE]
                ),
            ),
            # The self-check found a node problem (GPU/EFA missing, disk not writable): like a
            # disruption, replace the pod without consuming the index's budget.
            k8s.PodFailurePolicyRule(
                action="Ignore",
                on_exit_codes=k8s.PodFailurePolicyOnExitCodesRequirement(
                    container_name=SELFCHECK_CONTAINER, operator="In", values=[NODE_PROBLEM_EXIT_CODE]
                ),
            ),
            # Every rank of the pod was stopped by its own launcher after a rank on another node failed
            # (training/resilience/launch.py): the fault was elsewhere, and that pod's index is charged.
            k8s.PodFailurePolicyRule(
                action="Ignore",
                on_exit_codes=k8s.PodFailurePolicyOnExitCodesRequirement(
                    container_name=TRAINER_CONTAINER, operator="In", values=[COLLATERAL_EXIT_CODE]
                ),
            ),
            k8s.PodFailurePolicyRule(
                action="Ignore",
                on_pod_conditions=[
                    k8s.PodFailurePolicyOnPodConditionsPattern(type="DisruptionTarget", status="True")
                ],
            ),
        ]
    )


def _trainer_env(values: JobValues, *, port: int | None) -> list[k8s.EnvVar]:
    """What the self-check and the launcher (and so every rank) see: the pod's index, the chart's
    variables, the kit's section (NVRX_EKS_CONFIG) and the preloads."""
    env = [*_index_env(), _run_id_env(), *container_env(values), *([_pod_ip_env()] if port else [])]
    script_env = resilience_env(values.entrypoint, values.trainer)
    env += [k8s.EnvVar(name=k, value=v) for k, v in sorted(script_env.items())]
    if values.peer_replicas:
        env.append(_failure_domain_env())
    if values.image != LOCAL_IMAGE:
        # $HOME on the scratch volume: the root filesystem is read-only (trainer_security); TMPDIR
        # stays unset, so /tmp (the same volume) is the temporary folder.
        env.append(k8s.EnvVar(name="HOME", value=SCRATCH_PATH))
    return env


def _selfcheck_container(
    values: JobValues, *, image: str, pull: str, env: list[k8s.EnvVar], mounts: list[k8s.VolumeMount]
) -> k8s.Container:
    """The self-check, in every pod (images/README.md): exit 2 fails the Job, 75 (node problem) replaces
    the pod without consuming the budget (_failure_policy). It gets the trainer's resources, env and
    mounts: the kubelet hands an init container's GPUs/EFA devices on to the main container, so the
    check sees the devices the ranks will use, at no extra request."""
    return k8s.Container(
        name=SELFCHECK_CONTAINER,
        image=image,
        image_pull_policy=pull,
        command=selfcheck_command(values),
        # Its node's name, with which it records a node problem for the other pods to compare.
        env=[*env, _node_name_env()],
        resources=_resources(values),
        volume_mounts=mounts,
        security_context=trainer_security(),
        # A failed check's pod status carries the verdict line (`job status` names it).
        termination_message_policy="FallbackToLogsOnError",
    )


def _trainer_container(
    values: JobValues,
    *,
    image: str,
    pull: str,
    env: list[k8s.EnvVar],
    mounts: list[k8s.VolumeMount],
    port: int | None,
) -> k8s.Container:
    """The launcher (training/resilience/launch.py or torchrun), which starts the node's ranks."""
    command = launcher_command(
        values,
        store_endpoint=store_endpoint(values),
        node_address=node_address(values),
        entry=values.entrypoint.command(),
    )
    return k8s.Container(
        name=TRAINER_CONTAINER,
        image=image,
        image_pull_policy=pull,
        command=command,
        env=env,
        ports=metrics_ports(port, values.profile.workers_per_node) if port else None,
        resources=_resources(values),
        volume_mounts=mounts,
        security_context=trainer_security(),
        # A failed pod's status carries its log tail: the launcher's root cause (rank, exit code,
        # signal), which `job status` and a failed job's reason name (k8s/termination.py).
        termination_message_policy="FallbackToLogsOnError",
    )


def _training_pod(values: JobValues, *, port: int | None) -> k8s.PodSpec:
    """One training pod: its init containers (folder owner, self-check, topology), then the launcher."""
    image, pull = _image(values)
    volumes, mounts = _volumes(values)
    env = _trainer_env(values, port=port)
    # A container image first hands the trainer its folders on root-owned volumes; `image: local` runs
    # as this machine's user, who owns them already.
    folders = trainer_owned_folders(values)
    init_containers = (
        []
        if values.image == LOCAL_IMAGE
        else [owner_setup_container(image=image, pull=pull, folders=folders, mounts=mounts)]
    )
    init_containers.append(_selfcheck_container(values, image=image, pull=pull, env=env, mounts=mounts))
    trainer_env, trainer_mounts = list(env), list(mounts)
    if values.peer_replicas:
        # Last: the node's labels for the peer replica's partners (FAILURE_DOMAIN_LABELS).
        topology, topology_volumes, topology_mount = topology_init(image=image, pull=pull)
        init_containers.append(topology)
        volumes += topology_volumes
        trainer_mounts.append(topology_mount)
        trainer_env.append(k8s.EnvVar(name=TOPOLOGY_FILE_ENV, value=TOPOLOGY_FILE))
    trainer = _trainer_container(
        values, image=image, pull=pull, env=trainer_env, mounts=trainer_mounts, port=port
    )
    return k8s.PodSpec(
        restart_policy="Never",
        subdomain=headless_service_name(values),
        service_account_name=values.service_account,
        automount_service_account_token=False,
        priority_class_name=values.priority_class,
        node_selector=_node_selector(values) or None,
        tolerations=(
            [k8s.Toleration(key=names.GPU_TAINT_KEY, operator="Exists", effect=names.GPU_TAINT_EFFECT)]
            if values.profile.gpus
            else None
        ),
        # Ranks get workers_stop + term timeouts to save and leave before SIGKILL.
        termination_grace_period_seconds=int(values.timeouts.workers_stop_s + values.timeouts.term_s),
        # The runtime's default seccomp filter for every container of the pod, init ones included.
        security_context=k8s.PodSecurityContext(seccomp_profile=RUNTIME_DEFAULT_SECCOMP),
        init_containers=init_containers,
        containers=[trainer],
        volumes=volumes,
    )


def _node_selector(values: JobValues) -> dict[str, str]:
    selector = dict(values.gpu_node_selector)
    if values.profile.is_ec2:
        selector.setdefault("node.kubernetes.io/instance-type", values.profile.name)
    if values.verified_nodes_required:
        # Set by the node check (training/node/nodecheck.py): a node takes work once it passed.
        selector[VERIFIED_LABEL] = "true"
    return selector


class TrainingJob(Construct):
    """The Indexed Job: one pod per node running the launcher, which starts the node's ranks."""

    def __init__(self, scope: Construct, id: str, *, values: JobValues) -> None:  # noqa: A002
        super().__init__(scope, id)
        labels = names.job_labels(values.name, "trainer")
        if values.kueue_queue:
            labels["kueue.x-k8s.io/queue-name"] = values.kueue_queue
        port = metrics_port(values)  # the trainer's /metrics, served when the values ask for it
        pod = _training_pod(values, port=port)
        b = values.budgets
        k8s.KubeJob(
            self,
            "job",
            metadata=k8s.ObjectMeta(name=values.name, namespace=values.namespace, labels=labels),
            spec=k8s.JobSpec(
                completion_mode="Indexed",
                # Spares are pods of the same Job: every pod runs the launcher, the rendezvous admits
                # num_nodes and keeps the rest waiting (k8s/values.py `spares`).
                completions=values.num_nodes + values.spares,
                parallelism=values.num_nodes + values.spares,
                # With spares the job is done once num_nodes pods succeeded: the Job controller then
                # ends the spares still waiting (or a replacement that arrived after the finish and
                # would meet a closed rendezvous) instead of replacing them
                # (https://kubernetes.io/docs/concepts/workloads/controllers/job/#success-policy).
                success_policy=(
                    k8s.SuccessPolicy(rules=[k8s.SuccessPolicyRule(succeeded_count=values.num_nodes)])
                    if values.spares
                    else None
                ),
                backoff_limit_per_index=b.job_backoff_limit_per_index,
                max_failed_indexes=0,
                pod_replacement_policy="Failed",
                pod_failure_policy=_failure_policy(),
                # Kueue admits (unsuspends) a queued job; without Kueue it starts at once.
                suspend=True if values.kueue_queue else None,
                active_deadline_seconds=values.active_deadline_s,
                ttl_seconds_after_finished=values.ttl_after_finished_s,
                template=k8s.PodTemplateSpec(
                    metadata=k8s.ObjectMeta(
                        labels=labels,
                        annotations={
                            **(scrape_annotations(port) if port else {}),
                            **(
                                {FAILURE_DOMAIN_ANNOTATION: ",".join(FAILURE_DOMAIN_LABELS)}
                                if values.peer_replicas
                                else {}
                            ),
                        }
                        or None,
                    ),
                    spec=pod,
                ),
            ),
        )


class JobChart(cdk8s.Chart):
    """Everything one training job needs; cluster-level objects are in k8s/cluster_chart.py."""

    def __init__(self, scope: Construct, id: str, *, values: JobValues) -> None:  # noqa: A002
        super().__init__(scope, id, namespace=values.namespace)
        policies = JobNetworkPolicies(self, "network", values=values)
        store = RendezvousStore(self, "rendezvous", values=values)
        nodes = NodesService(self, "nodes", values=values)
        job = TrainingJob(self, "training", values=values)
        # The policies exist before any pod of the job does: no window with the store open.
        store.node.add_dependency(policies)
        job.node.add_dependency(store, nodes, policies)


def render(values: JobValues, out_dir: str) -> list[str]:
    """Synthesize the job chart into `out_dir` (one YAML file per chart); return the files written."""
    _check_out_dir(Path(out_dir))
    app = cdk8s.App(outdir=out_dir, yaml_output_type=cdk8s.YamlOutputType.FILE_PER_CHART)
    JobChart(app, values.name, values=values)
    app.synth()
    return sorted(str(p) for p in Path(out_dir).glob("*.k8s.yaml"))


def _check_out_dir(out: Path) -> None:
    """`out` must be a folder or creatable as one (cdk8s would fail in jsii with a Node stack trace)."""
    for folder in (out, *out.parents):
        if folder.exists():
            if not folder.is_dir():
                what = "is a file" if folder == out else f"is below {folder}, a file"
                raise UserError(f"-o {out}: {what}; pass a folder for the manifests (e.g. -o dist)")
            if not os.access(folder, os.W_OK | os.X_OK):
                raise UserError(f"-o {out}: {folder} is not writable; pass a folder you can write to")
            return
