"""The instance profile table and the EFA interface layout derived from it."""

from __future__ import annotations

import pytest

from nvrx_eks.infra.constructs.launch_template import efa_interface_layout, nodeadm_node_config
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.kitcore.profiles import PROFILES, get_profile

EC2_GPU = [name for name, p in PROFILES.items() if p.is_ec2]


@pytest.mark.parametrize(
    ("name", "gpus", "efa", "cards"),
    [
        ("p5.48xlarge", 8, 32, 32),
        ("p5e.48xlarge", 8, 32, 32),
        ("p5en.48xlarge", 8, 16, 16),
        ("p4d.24xlarge", 8, 4, 4),
        ("p4de.24xlarge", 8, 4, 4),
        ("g6.8xlarge", 1, 1, 1),
    ],
)
def test_documented_gpu_and_network_facts(name, gpus, efa, cards):
    profile = get_profile(name, ec2_only=True)
    assert (profile.gpus, profile.efa_devices, profile.network_cards) == (gpus, efa, cards)
    assert profile.workers_per_node == gpus
    assert "efa-acc-inst-types" in profile.source


@pytest.mark.parametrize(
    ("name", "generation", "gbps"),
    [
        # P5 and P5e run 3rd Gen AMD EPYC (PCIe Gen4): ~25 GB/s per GPU; only P5en is Gen5.
        ("p5.48xlarge", 4, 25.2),
        ("p5e.48xlarge", 4, 25.2),
        ("p5en.48xlarge", 5, 50.4),
        ("p4d.24xlarge", 3, 12.6),
        ("g6.8xlarge", 4, 25.2),
    ],
)
def test_host_link_per_instance_type_names_its_source(name, generation, gbps):
    link = get_profile(name).host_link
    assert link is not None
    assert (link.generation, link.gbps) == (generation, gbps)
    assert link.source.startswith("https://")
    assert f"PCIe Gen{generation} x16" in link.derivation
    assert link.source in link.derivation


def test_every_gpu_profile_has_a_host_link_and_the_cpu_one_none():
    assert all((p.host_link is not None) == (p.gpus > 0) for p in PROFILES.values())


@pytest.mark.parametrize("name", EC2_GPU)
def test_layout_has_one_ena_primary_and_one_efa_per_card(name):
    profile = get_profile(name)
    slots = efa_interface_layout(profile)
    assert (slots[0].network_card, slots[0].device_index, slots[0].interface_type) == (0, 0, "interface")
    efa = [s for s in slots if s.interface_type == "efa-only"]
    assert len(efa) == profile.efa_devices
    # Every network card carries exactly one EFA-only interface; card 0 at device 1, others at device 0.
    assert sorted(s.network_card for s in efa) == list(range(profile.network_cards))
    assert {(s.network_card, s.device_index) for s in efa if s.network_card == 0} == {(0, 1)}
    assert all(s.device_index == 0 for s in efa if s.network_card > 0)
    assert len({(s.network_card, s.device_index) for s in slots}) == len(slots)


def test_local_profile_has_no_efa_and_no_raid():
    local = get_profile("local-cpu")
    assert [s.interface_type for s in efa_interface_layout(local)] == ["interface"]
    assert nodeadm_node_config(local)["spec"] == {}
    assert local.workers_per_node == 2


def test_nvme_profiles_ask_nodeadm_for_raid0():
    config = nodeadm_node_config(get_profile("p5.48xlarge"))
    assert config["kind"] == "NodeConfig"
    assert config["spec"]["instance"] == {"localStorage": {"strategy": "RAID0"}}


def test_efa_profiles_give_containers_the_memlock_limit_and_keep_nofile():
    rlimits = nodeadm_node_config(get_profile("p5.48xlarge"))["spec"]["containerd"]["baseRuntimeSpec"]
    by_type = {r["type"]: r for r in rlimits["process"]["rlimits"]}
    # nodeadm replaces the default spec's rlimits list: NOFILE stays at the AL2023 default.
    assert by_type["RLIMIT_NOFILE"] == {"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576}
    memlock = by_type["RLIMIT_MEMLOCK"]
    assert memlock["soft"] == memlock["hard"] >= 2**40
    # nodeadm merges through float64 (Go encoding/json): the value must come back as the same uint64.
    assert int(float(memlock["hard"])) == memlock["hard"] < 2**64
    assert "containerd" not in nodeadm_node_config(get_profile("local-cpu"))["spec"]


def test_unknown_and_local_types_are_refused_for_ec2():
    with pytest.raises(UserError, match=r"unknown instance type 'p9\.huge'"):
        get_profile("p9.huge")
    with pytest.raises(UserError, match=r"use one of: p5\.48xlarge"):
        get_profile("local-cpu", ec2_only=True)
