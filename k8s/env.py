"""The training container's environment, from one place.

EFA/NCCL settings apply to profiles with EFA devices; CPU profiles get the gloo-friendly thread
settings. Secrets come only from Secret references (values.secret_env), never as plain values, and AWS
access comes from EKS Pod Identity (no keys at all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdk8s_plus_33 import k8s

from nvrx_eks.k8s.sections import REGION_ENV
from nvrx_eks.training.node.selfcheck import PROFILE_ENV
from nvrx_eks.training.resilience.modes import layers

if TYPE_CHECKING:
    from nvrx_eks.k8s.values import JobValues

# https://docs.aws.amazon.com/eks/latest/userguide/node-efa.html and the aws-ofi-nccl docs.
EFA_NCCL_ENV: dict[str, str] = {
    "FI_PROVIDER": "efa",  # libfabric must use EFA, not fall back to TCP sockets silently
    "FI_EFA_USE_DEVICE_RDMA": "1",  # GPUDirect RDMA (p4d/p5 and later)
    "FI_EFA_FORK_SAFE": "1",  # data loader workers fork after libfabric initialized
    "NCCL_SOCKET_IFNAME": "^lo,docker",  # bootstrap over the pod's network, never loopback
    "NCCL_DEBUG": "WARN",
    # Abort NCCL communicators on errors/timeouts so the layers above can restart (NVRx needs this).
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}
CPU_ENV: dict[str, str] = {
    # Two ranks per 2-core "node": one thread each, or the ranks fight for the cores.
    "OMP_NUM_THREADS": "1",
}
COMMON_ENV: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
# Plain torchrun (the baseline's launcher) shares its rendezvous TCPStore with the workers by default; a
# node loss then takes the store with it: the survivors exit and a replacement cannot rejoin.
BASELINE_ENV: dict[str, str] = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def plain_env(values: JobValues) -> dict[str, str]:
    # The self-check compares the node with this profile (GPU count, EFA devices, /dev/shm).
    env = COMMON_ENV | {PROFILE_ENV: values.instance_profile}
    env |= EFA_NCCL_ENV if values.profile.efa_devices else {}
    env |= CPU_ENV if not values.profile.gpus else {}
    env |= BASELINE_ENV if layers(values.mode).launcher == "torchrun" else {}
    # The SDKs' Region (k8s/values.py REGION_ENV): the pods cannot reach the instance metadata service.
    env |= dict.fromkeys(REGION_ENV, values.aws_region) if values.aws_region else {}
    env |= values.env
    return env


def container_env(values: JobValues) -> list[k8s.EnvVar]:
    plain = [k8s.EnvVar(name=k, value=v) for k, v in sorted(plain_env(values).items())]
    secret = [
        k8s.EnvVar(
            name=name,
            value_from=k8s.EnvVarSource(secret_key_ref=k8s.SecretKeySelector(name=ref.secret, key=ref.key)),
        )
        for name, ref in sorted(values.secret_env.items())
    ]
    return plain + secret
