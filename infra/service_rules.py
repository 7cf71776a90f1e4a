"""The rules EC2, EKS and ECR apply to names and addresses, checked before a deploy (the Kubernetes and
S3 naming rules, which the job values share, are in kitcore/naming.py).

Each check returns None when the value is acceptable, else the reason and the fix in one sentence, so
infra/config.py can raise it as a field message. Only the rules the services document are encoded
here (links beside each); nothing calls AWS.
"""

from __future__ import annotations

import ipaddress
import re

# -- EC2 ------------------------------------------------------------------------------------------

# An Availability Zone name is its region plus one letter (us-east-1a). Local Zones
# (us-east-1-bos-1a) and Wavelength Zones are not valid for EKS cluster subnets.
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-regions-availability-zones.html
# https://docs.aws.amazon.com/eks/latest/userguide/network-reqs.html
_ZONE = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")

# Instance type names: family (letters, generation digit, attribute letters, optional -flex etc.),
# a dot, then the size (xlarge, 48xlarge, metal, metal-24xl, ...).
# https://docs.aws.amazon.com/ec2/latest/instancetypes/instance-type-names.html
_INSTANCE_TYPE = re.compile(r"^(?P<series>[a-z]+)(?P<generation>\d+)(?P<options>[a-z-]*)\.[a-z0-9-]+$")
# Series whose processor options letter 'g' does not mean Graviton: g is the GPU series itself.
_GRAVITON = "g"


def zone_problem(zone: str, *, region: str) -> str | None:
    if not _ZONE.match(zone):
        return f"{zone!r} is not an Availability Zone name; use the region plus a letter, e.g. {region}a"
    if zone[:-1] != region:
        return f"{zone} is not in region {region}; use a zone of {region} such as {region}a"
    return None


def instance_type_problem(instance_type: str, *, x86_only: bool = False) -> str | None:
    match = _INSTANCE_TYPE.match(instance_type)
    if match is None:
        return f"{instance_type!r} is not an EC2 instance type name such as m7i.xlarge (family.size)"
    # A 'g' among the processor options (m7g, c7gn, r8gd) is AWS Graviton (arm64): the system node
    # group uses the x86_64 AL2023 AMI, and EKS refuses an AMI type the instance cannot boot.
    if x86_only and _GRAVITON in match["options"].split("-")[0]:
        return (
            f"{instance_type} is a Graviton (arm64) type; system nodes use the x86_64 AL2023 AMI, "
            "pick an x86_64 type such as m7i.xlarge"
        )
    return None


# -- VPC and EKS networking -----------------------------------------------------------------------

# A VPC's IPv4 block must come from RFC 1918 space or 100.64.0.0/10 for the VPC CNI to give pods
# addresses that stay private; public ranges are accepted by EC2 but collide with internet addresses.
# https://docs.aws.amazon.com/vpc/latest/userguide/vpc-cidr-blocks.html
PRIVATE_RANGES = tuple(
    ipaddress.IPv4Network(block)
    for block in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")
)
# The Kubernetes service range: RFC 1918 only, /24 to /12, not overlapping the VPC.
# https://docs.aws.amazon.com/eks/latest/APIReference/API_KubernetesNetworkConfigRequest.html
SERVICE_RANGES = PRIVATE_RANGES[:3]
SERVICE_PREFIX_RANGE = (12, 24)


def parse_ipv4_block(value: str) -> ipaddress.IPv4Network | str:
    """The network of a CIDR string, or the reason it is not one."""
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        return f"{value!r} is not an IPv4 CIDR block such as 10.0.0.0/16"
    if not isinstance(network, ipaddress.IPv4Network):
        return f"{value!r} is an IPv6 block; this kit's VPC and cluster are IPv4 (e.g. 10.0.0.0/16)"
    if str(network) != value:
        return f"{value!r} has host bits set; write the network address: {network}"
    return network


def vpc_block_problem(
    network: ipaddress.IPv4Network, *, zones: int, public_mask: int, private_mask: int
) -> str | None:
    if not any(network.subnet_of(block) for block in PRIVATE_RANGES):
        return f"{network} is not private address space; use 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16"
    needed = subnet_space(zones=zones, public_mask=public_mask, private_mask=private_mask)
    if needed > network.num_addresses:
        # The smallest prefix that holds them: every address count here is a power of two times a
        # whole number, so round up to the next power of two.
        prefix = 32 - (needed - 1).bit_length()
        return (
            f"{network} cannot hold a /{public_mask} public and a /{private_mask} private subnet in each "
            f"of {zones} zones ({needed} addresses); use a /{prefix} or larger block, e.g. 10.0.0.0/{prefix}"
        )
    return None


def subnet_space(*, zones: int, public_mask: int, private_mask: int) -> int:
    """Addresses the CDK's VPC allocator uses: all public subnets first, then each private subnet
    aligned to its own size (so the public ones take a whole private-sized slot)."""
    public = zones * 2 ** (32 - public_mask)
    private_size = 2 ** (32 - private_mask)
    return int(-(-public // private_size) * private_size + zones * private_size)


def service_block_problem(network: ipaddress.IPv4Network, *, vpc: ipaddress.IPv4Network) -> str | None:
    low, high = SERVICE_PREFIX_RANGE
    if not any(network.subnet_of(block) for block in SERVICE_RANGES):
        return f"{network} is not in 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16, as EKS requires"
    if not low <= network.prefixlen <= high:
        return f"{network} must be between a /{low} and a /{high} block for EKS (e.g. 172.20.0.0/16)"
    if network.overlaps(vpc):
        return f"{network} overlaps the VPC block {vpc}; pick a range outside it such as 172.20.0.0/16"
    return None


# -- ECR -------------------------------------------------------------------------------------------

# https://docs.aws.amazon.com/AmazonECR/latest/APIReference/API_CreateRepository.html
_ECR_REPOSITORY = re.compile(r"^(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*$")
ECR_NAME_LENGTH = (2, 256)


def ecr_repository_problem(name: str) -> str | None:
    low, high = ECR_NAME_LENGTH
    if not low <= len(name) <= high or not _ECR_REPOSITORY.match(name):
        return (
            f"{name!r} is not an ECR repository name: 2-256 lowercase letters and digits, with single "
            "'.', '_', '-' between them and '/' between path parts (e.g. nvrx-eks/trainer)"
        )
    return None
