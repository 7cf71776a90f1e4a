"""The one table of instance profiles.

It feeds the CDK launch templates (EFA network interfaces, NVMe RAID0), the job charts (GPU/EFA
requests, CPU/memory, /dev/shm) and the trainer's self-check (GPU count). Nothing else in the kit
types these numbers.

Facts are from the Amazon EC2 documentation; each row names its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvrx_eks.kitcore.configio import UserError


@dataclass(frozen=True, kw_only=True)
class HostLink:
    """The CPU-GPU link one GPU copies its state to host memory over: the memory snapshot's floor."""

    generation: int
    """PCI Express generation the host side runs the GPU's x16 link at."""
    source: str
    """Documentation naming the host CPU (and so the generation) for this instance type."""

    @property
    def name(self) -> str:
        return f"PCIe Gen{self.generation} x16"

    @property
    def raw_gbps(self) -> float:
        """One direction's line rate, GB/s: transfers/s x 16 lanes x 128b/130b encoding / 8 bits."""
        return _PCIE_GTS[self.generation] * _LANES * 128 / 130 / 8

    @property
    def gbps(self) -> float:
        """Device-to-host copy, GB/s, practical: the line rate less packet overhead."""
        return round(self.raw_gbps * PCIE_PRACTICAL_SHARE, 1)

    @property
    def derivation(self) -> str:
        return (
            f"{self.name}: {self.raw_gbps:.1f} GB/s line rate x {PCIE_PRACTICAL_SHARE:.0%} practical "
            f"= {self.gbps} GB/s per GPU ({self.source})"
        )


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
    host_link: HostLink | None = None
    """How each GPU reaches host memory (None: no GPU)."""
    is_ec2: bool = True
    cpu_ranks: int = 2
    """Trainer ranks per node where there is no GPU (a local pseudo-type's CPU ranks)."""
    source: str = ""
    """Documentation the row was taken from."""

    @property
    def workers_per_node(self) -> int:
        """Trainer ranks per node: one per GPU; a CPU pseudo-profile runs `cpu_ranks`."""
        return self.gpus or self.cpu_ranks

    @property
    def nvme_total_gib(self) -> int:
        return self.nvme_count * self.nvme_gib_each


# Sources (Amazon EC2 documentation):
# - _SPECS: "Specifications for Amazon EC2 accelerated computing instances" (GPUs, GPU memory, vCPU,
#   memory, instance store volumes, network cards, EFA support).
# - _EFA: EC2 user guide "Maximize network bandwidth on Amazon EC2 instances with multiple network
#   cards" (efa-acc-inst-types): one EFA per network card; primary ENA interface on card 0 device 0,
#   EFA-only interfaces on card 0 device 1 and device 0 of every other card.
# Instance store sizes are published in GB (10^9 bytes); nvme_gib_each is that size in GiB, rounded
# down (3800 GB = 3539 GiB, 1000 GB = 931 GiB, 450 GB = 419 GiB), because RAID0 and the
# kubelet report GiB.
_SPECS = "https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html"
_EFA = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html"
_SRC = f"{_SPECS}; {_EFA}"

# The CPU-GPU host link. Every GPU here sits on a x16 link; its generation is the lower of the GPU's
# and the host CPU's, and every GPU in the table does Gen4 or better (H100/H200 SXM: Gen5), so the CPU
# decides it:
# - _P5: the Amazon EC2 P5 instance page lists P5 and P5e with 3rd Gen AMD EPYC processors (Milan:
#   PCIe Gen4) and P5en with 4th Gen Intel Xeon Scalable processors (Sapphire Rapids: PCIe Gen5).
# - _P5EN: the P5en launch announcement: "PCIe Gen5 between CPU and GPU", "up to 4x the bandwidth
#   between CPU and GPU" against P5 (instance-wide; per GPU the generation doubles the line rate).
# - _SPECS names the processor of P4d/P4de (2nd Gen Intel Xeon Scalable, Cascade Lake: its root ports
#   run PCIe Gen3, whatever the A100's switches do) and G6 (3rd Gen AMD EPYC: Gen4; the L4 itself is
#   a Gen4 x16 card).
# Line rates are PCI-SIG's (Gen3 8, Gen4 16, Gen5 32 GT/s per lane, 128b/130b encoding). A pinned
# device-to-host copy reaches about 80% of the line rate (transaction-layer headers and flow control:
# ~25 of 31.5 GB/s on Gen4); PCIE_PRACTICAL_SHARE is that assumption, shown wherever a figure is used.
_P5 = "https://aws.amazon.com/ec2/instance-types/p5/"
_P5EN = (
    "https://aws.amazon.com/about-aws/whats-new/2024/12/"
    "amazon-ec2-p5en-instances-generative-ai-hpc-generally-available/"
)
_PCIE_GTS = {3: 8.0, 4: 16.0, 5: 32.0}
_LANES = 16
PCIE_PRACTICAL_SHARE = 0.8
_GEN4_P5 = HostLink(generation=4, source=f"{_P5}: 3rd Gen AMD EPYC")
_GEN5_P5EN = HostLink(generation=5, source=f"{_P5}: 4th Gen Intel Xeon Scalable; {_P5EN}")
_GEN3_P4 = HostLink(generation=3, source=f"{_SPECS}: 2nd Gen Intel Xeon Scalable")
_GEN4_G6 = HostLink(generation=4, source=f"{_SPECS}: 3rd Gen AMD EPYC")

# fmt: off
PROFILES: dict[str, InstanceProfile] = {
    p.name: p
    for p in (
        # p5.48xlarge: 8 x H100 80 GB HBM3, 192 vCPU, 2048 GiB, 8 x 3800 GB NVMe, 32 network cards,
        # 32 EFA (3200 Gbps). Source: _SPECS (P5 row), _EFA (P5 section).
        InstanceProfile(
            name="p5.48xlarge", accelerator="H100", gpus=8, gpu_memory_gib=80, efa_devices=32,
            network_cards=32, vcpus=192, memory_gib=2048, nvme_count=8, nvme_gib_each=3539,
            host_link=_GEN4_P5, source=_SRC,
        ),
        # p5e.48xlarge: 8 x H200 141 GB HBM3e, 192 vCPU, 2048 GiB, 8 x 3800 GB NVMe, 32 network
        # cards, 32 EFA (3200 Gbps). Source: _SPECS (P5e row), _EFA (P5/P5e section).
        InstanceProfile(
            name="p5e.48xlarge", accelerator="H200", gpus=8, gpu_memory_gib=141, efa_devices=32,
            network_cards=32, vcpus=192, memory_gib=2048, nvme_count=8, nvme_gib_each=3539,
            host_link=_GEN4_P5, source=_SRC,
        ),
        # p5en.48xlarge: 8 x H200 141 GB, 192 vCPU, 2048 GiB, 8 x 3800 GB NVMe, 16 network cards,
        # 16 EFA (EFAv3, 3200 Gbps). Source: _SPECS (P5en row), _EFA.
        InstanceProfile(
            name="p5en.48xlarge", accelerator="H200", gpus=8, gpu_memory_gib=141, efa_devices=16,
            network_cards=16, vcpus=192, memory_gib=2048, nvme_count=8, nvme_gib_each=3539,
            host_link=_GEN5_P5EN, source=_SRC,
        ),
        # p4d.24xlarge: 8 x A100 40 GB HBM2, 96 vCPU, 1152 GiB, 8 x 1000 GB NVMe, 4 network cards,
        # 4 EFA (400 Gbps). Source: _SPECS (P4d row), _EFA.
        InstanceProfile(
            name="p4d.24xlarge", accelerator="A100", gpus=8, gpu_memory_gib=40, efa_devices=4,
            network_cards=4, vcpus=96, memory_gib=1152, nvme_count=8, nvme_gib_each=931,
            host_link=_GEN3_P4, source=_SRC,
        ),
        # p4de.24xlarge: 8 x A100 80 GB HBM2e, otherwise as p4d. Source: _SPECS (P4de row), _EFA.
        InstanceProfile(
            name="p4de.24xlarge", accelerator="A100", gpus=8, gpu_memory_gib=80, efa_devices=4,
            network_cards=4, vcpus=96, memory_gib=1152, nvme_count=8, nvme_gib_each=931,
            host_link=_GEN3_P4, source=_SRC,
        ),
        # g6.8xlarge (cheap development): 1 x L4 24 GB, 32 vCPU, 128 GiB, 2 x 450 GB NVMe, 1 network
        # card, 1 EFA (g6.8xlarge is the smallest G6 size with EFA). Source: _SPECS (G6 row), _EFA.
        InstanceProfile(
            name="g6.8xlarge", accelerator="L4", gpus=1, gpu_memory_gib=24, efa_devices=1,
            network_cards=1, vcpus=32, memory_gib=128, nvme_count=2, nvme_gib_each=419,
            host_link=_GEN4_G6, source=_SRC,
        ),
        InstanceProfile(
            name="local-cpu", accelerator="none", gpus=0, gpu_memory_gib=0, efa_devices=0,
            network_cards=1, vcpus=2, memory_gib=4, nvme_count=0, nvme_gib_each=0, is_ec2=False,
            source="this kit: CPU ranks over gloo on one machine (local executor)",
        ),
        # One rank per node: 8 local "nodes" of 2 ranks would be 16 processes on this machine's 2 cores;
        # at 1 rank each, a node count's costs (rendezvous, teardown, rejoin) are measured, not the CPU's
        # contention (`nvrx-eks bench scale`).
        InstanceProfile(
            name="local-cpu-1", accelerator="none", gpus=0, gpu_memory_gib=0, efa_devices=0,
            network_cards=1, vcpus=2, memory_gib=4, nvme_count=0, nvme_gib_each=0, is_ec2=False,
            cpu_ranks=1, source="this kit: one CPU rank per node over gloo on one machine (local executor)",
        ),
    )
}
# fmt: on


def get_profile(name: str, *, ec2_only: bool = False) -> InstanceProfile:
    """The profile for `name`, or a UserError listing the known ones."""
    profile = PROFILES.get(name)
    if profile is None or (ec2_only and not profile.is_ec2):
        known = ", ".join(n for n, p in PROFILES.items() if p.is_ec2 or not ec2_only)
        raise UserError(f"unknown instance type {name!r}; use one of: {known}")
    return profile


def profile_for_field(name: str, *, ec2_only: bool = False) -> InstanceProfile:
    """`get_profile` for a pydantic field validator: the same refusal as a ValueError, the one error
    pydantic reports as the field's own message."""
    try:
        return get_profile(name, ec2_only=ec2_only)
    except UserError as exc:
        raise ValueError(str(exc)) from None
