"""Launch template pieces shared by the node groups: EFA interface layout, nodeadm user data, IMDS.

Pure functions where possible, so the layout derived from the profile table is testable on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import yaml
from aws_cdk import Fn
from aws_cdk import aws_ec2 as ec2

if TYPE_CHECKING:
    from collections.abc import Sequence

    from nvrx_eks.kitcore.profiles import InstanceProfile

# IMDSv2 only, and a hop limit of 1: the PUT that fetches a session token cannot cross the extra
# network hop into a pod's network namespace, so ordinary (non-hostNetwork) pods cannot read the
# node role's credentials; they get their own through EKS Pod Identity.
# https://docs.aws.amazon.com/eks/latest/best-practices/identity-and-access-management.html#_restrict_access_to_the_instance_profile_assigned_to_the_worker_node
# System nodes too: they run the rendezvous store and controllers whose pods would otherwise reach
# the node role. The controller there that looks its region up through IMDS (FSx CSI) falls back to
# the Kubernetes API (the node's region label) when IMDS does not answer (the fallback shows in the
# logs of kubernetes-sigs/aws-fsx-csi-driver#429); hostNetwork agents (VPC CNI, Pod Identity agent)
# are not behind the extra hop.
IMDS_HOP_LIMIT = 1


InterfaceType = Literal["interface", "efa-only"]


@dataclass(frozen=True)
class InterfaceSlot:
    network_card: int
    device_index: int
    interface_type: InterfaceType


def efa_interface_layout(profile: InstanceProfile) -> list[InterfaceSlot]:
    """Network interfaces for `profile`, following the EC2 user guide's recommendation.

    efa-acc-inst-types: the primary interface (card 0, device 0) is an ENA interface; if card 0
    supports EFA, an EFA-only interface goes on card 0, device 1; every further network card gets an
    EFA-only interface at device 0. One EFA device per card, so efa_devices == network_cards.
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html
    """
    slots = [InterfaceSlot(0, 0, "interface")]
    if profile.efa_devices == 0:
        return slots
    if profile.efa_devices != profile.network_cards:
        msg = (
            f"{profile.name}: {profile.efa_devices} EFA devices on {profile.network_cards} network cards; "
            "the layout puts one EFA per card (check kitcore/profiles.py)"
        )
        raise ValueError(msg)
    slots.append(InterfaceSlot(0, 1, "efa-only"))
    slots.extend(InterfaceSlot(card, 0, "efa-only") for card in range(1, profile.network_cards))
    return slots


def network_interfaces(
    profile: InstanceProfile, *, security_group_ids: Sequence[str]
) -> list[ec2.CfnLaunchTemplate.NetworkInterfaceProperty]:
    """The launch template's NetworkInterfaces for `profile` (subnets come from the node group)."""
    return [
        ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
            network_card_index=slot.network_card,
            device_index=slot.device_index,
            # "interface" is ENA; the CloudFormation value for EFA-only is "efa-only".
            interface_type=slot.interface_type,
            groups=list(security_group_ids),
            delete_on_termination=True,
        )
        for slot in efa_interface_layout(profile)
    ]


# The containers' rlimits on EFA nodes (nodeadm `containerd.baseRuntimeSpec`, merged over the AL2023
# default spec). The trainer runs as a non-root user without CAP_IPC_LOCK, so the memory libfabric and
# NCCL register with EFA is bounded by RLIMIT_MEMLOCK, which a container inherits from this spec; the
# AL2023 default sets only RLIMIT_NOFILE. nodeadm merges with Go's mergo, which replaces lists, so
# RLIMIT_NOFILE is repeated at the AL2023 default (soft 65536, hard 1048576). MEMLOCK is 2^62 bytes,
# not RLIM_INFINITY (2^64 - 1): nodeadm round-trips the spec through encoding/json's float64, which
# turns 2^64 - 1 into 2^64, a value the runtime's uint64 refuses; 2^62 survives exactly and is
# beyond any host's memory, so no registration is ever refused for it.
MEMLOCK_BYTES = 2**62
EFA_RLIMITS: tuple[dict[str, object], ...] = (
    {"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576},
    {"type": "RLIMIT_MEMLOCK", "soft": MEMLOCK_BYTES, "hard": MEMLOCK_BYTES},
)


def nodeadm_node_config(profile: InstanceProfile) -> dict[str, object]:
    """The NodeConfig merged into the EKS-generated one by nodeadm (AL2023)."""
    spec: dict[str, object] = {}
    if profile.nvme_count > 0:
        # nodeadm mounts the array at k8s/names.py NVME_RAID_ROOT (the node-local checkpoint tier).
        spec["instance"] = {"localStorage": {"strategy": "RAID0"}}
    if profile.efa_devices > 0:
        spec["containerd"] = {"baseRuntimeSpec": {"process": {"rlimits": [dict(r) for r in EFA_RLIMITS]}}}
    return {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}


def nodeadm_user_data(profile: InstanceProfile) -> str:
    """MIME multi-part user data: managed node groups require it to merge their own NodeConfig."""
    boundary = "==NVRXEKS=="
    body = yaml.safe_dump(nodeadm_node_config(profile), sort_keys=False)
    return (
        "MIME-Version: 1.0\n"
        f'Content-Type: multipart/mixed; boundary="{boundary}"\n\n'
        f"--{boundary}\n"
        "Content-Type: application/node.eks.aws\n\n"
        f"---\n{body}\n"
        f"--{boundary}--\n"
    )


def imds_options(hop_limit: int = IMDS_HOP_LIMIT) -> ec2.CfnLaunchTemplate.MetadataOptionsProperty:
    return ec2.CfnLaunchTemplate.MetadataOptionsProperty(
        http_endpoint="enabled",
        http_tokens="required",
        http_put_response_hop_limit=hop_limit,
    )


def root_volume(size_gib: int) -> ec2.CfnLaunchTemplate.BlockDeviceMappingProperty:
    # /dev/xvda is the root device of the EKS-optimized AL2023 AMIs.
    return ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
        device_name="/dev/xvda",
        ebs=ec2.CfnLaunchTemplate.EbsProperty(
            volume_size=size_gib, volume_type="gp3", encrypted=True, delete_on_termination=True
        ),
    )


def user_data_base64(text: str) -> str:
    return Fn.base64(text)
