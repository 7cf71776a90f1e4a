"""The one table of instance profiles.

It feeds the CDK launch templates (EFA network interfaces, NVMe RAID0), the job charts (GPU/EFA
requests, CPU/memory, /dev/shm) and the trainer's self-check (GPU count). Nothing else in the kit
types these numbers.

Facts are from the Amazon EC2 documentation; each row names its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.configio import UserError


@dataclass(frozen=True, kw_only=True)
class InstanceProfile:
    name: str
    """EC2 instance type, or a local pseudo-type (is_ec2=False) for CPU runs on one machine."""
    accelerator: str
    gpus: int
    gpu_memory_gib: int
    """Memory per GPU."""
    efa_devices: int
    """EFA interfaces a pod requests as `vpc.amazonaws.com/efa` (0: no EFA)."""
    network_cards: int
    vcpus: int
    memory_gib: int
    nvme_count: int
    nvme_gib_each: int
    is_ec2: bool = True
    source: str = ""
    """Documentation the row was taken from."""

    @property
    def workers_per_node(self) -> int:
        """Trainer ranks per node: one per GPU; the CPU pseudo-profile runs two."""
        return self.gpus or 2

    @property
    def nvme_total_gib(self) -> int:
        return self.nvme_count * self.nvme_gib_each


_P_FAMILY = "https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html"
_EFA = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html"

PROFILES: dict[str, InstanceProfile] = {
    p.name: p
    for p in (
        InstanceProfile(
            name="p5.48xlarge", accelerator="H100", gpus=8, gpu_memory_gib=80, efa_devices=32,
            network_cards=32, vcpus=192, memory_gib=2048, nvme_count=8, nvme_gib_each=3576,
            source=f"{_P_FAMILY}; {_EFA}",
        ),
        InstanceProfile(
            name="p5e.48xlarge", accelerator="H200", gpus=8, gpu_memory_gib=141, efa_devices=32,
            network_cards=32, vcpus=192, memory_gib=2048, nvme_count=8, nvme_gib_each=3576,
            source=f"{_P_FAMILY}; {_EFA}",
        ),
        InstanceProfile(
            name="p5en.48xlarge", accelerator="H200", gpus=8, gpu_memory_gib=141, efa_devices=16,
            network_cards=16, vcpus=192, memory_gib=2048, nvme_count=8, nvme_gib_each=3576,
            source=f"{_P_FAMILY}; {_EFA}",
        ),
        InstanceProfile(
            name="p4d.24xlarge", accelerator="A100", gpus=8, gpu_memory_gib=40, efa_devices=4,
            network_cards=4, vcpus=96, memory_gib=1152, nvme_count=8, nvme_gib_each=1000,
            source=f"{_P_FAMILY}; {_EFA}",
        ),
        InstanceProfile(
            name="p4de.24xlarge", accelerator="A100", gpus=8, gpu_memory_gib=80, efa_devices=4,
            network_cards=4, vcpus=96, memory_gib=1152, nvme_count=8, nvme_gib_each=1000,
            source=f"{_P_FAMILY}; {_EFA}",
        ),
        InstanceProfile(
            name="g6.8xlarge", accelerator="L4", gpus=1, gpu_memory_gib=24, efa_devices=1,
            network_cards=1, vcpus=32, memory_gib=128, nvme_count=2, nvme_gib_each=450,
            source=f"{_P_FAMILY}; {_EFA}",
        ),
        InstanceProfile(
            name="local-cpu", accelerator="none", gpus=0, gpu_memory_gib=0, efa_devices=0,
            network_cards=1, vcpus=2, memory_gib=4, nvme_count=0, nvme_gib_each=0, is_ec2=False,
            source="this kit: CPU ranks over gloo on one machine (local executor)",
        ),
    )
}


def get_profile(name: str, *, ec2_only: bool = False) -> InstanceProfile:
    """The profile for `name`, or a UserError listing the known ones."""
    profile = PROFILES.get(name)
    if profile is None or (ec2_only and not profile.is_ec2):
        known = ", ".join(n for n, p in PROFILES.items() if p.is_ec2 or not ec2_only)
        raise UserError(f"unknown instance type {name!r}; use one of: {known}")
    return profile
