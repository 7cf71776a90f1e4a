"""Where each shard comes from at restore (training/checkpoint/restore_anywhere.py), and who holds whose
copies (training/checkpoint/replica.py)."""

from __future__ import annotations

import json

import pytest

from nvrx_eks.training.checkpoint.domains import domain, levels
from nvrx_eks.training.checkpoint.replica import node_ring, partner_ranks, source_ranks
from nvrx_eks.training.checkpoint.restore import _plans, node_memory, read_slot
from nvrx_eks.training.checkpoint.shard import ShardError


def test_partners_are_the_same_local_rank_on_the_next_nodes():
    # 3 nodes x 2 ranks: rank 1 (node 0) is copied to node 1 and node 2; it holds nodes 2 and 1.
    assert partner_ranks(1, world_size=6, ranks_per_node=2, replicas=2) == [3, 5]
    assert source_ranks(1, world_size=6, ranks_per_node=2, replicas=2) == [5, 3]
    for rank in range(6):
        for partner in partner_ranks(rank, world_size=6, ranks_per_node=2, replicas=1):
            assert rank in source_ranks(partner, world_size=6, ranks_per_node=2, replicas=1)
            assert partner // 2 != rank // 2  # never the same node


def _layout(domains: list[str], replicas: int) -> dict:
    return {"world_size": 2 * len(domains), "ranks_per_node": 2, "replicas": replicas, "domains": domains}


def _partner_nodes(domains: list[str], replicas: int) -> dict[int, list[int]]:
    return {
        n: [r // 2 for r in partner_ranks(2 * n, **_layout(domains, replicas))] for n in range(len(domains))
    }


def test_partners_are_in_another_failure_domain_when_the_nodes_have_them():
    # Rank order puts both zone-a nodes first: the plain "next node" would copy node 0 to node 1, in
    # its own zone, and a zone outage would take the original and its copy together.
    domains = ["zone-a", "zone-a", "zone-b", "zone-b"]
    assert node_ring(domains) == [0, 2, 1, 3]
    partners = _partner_nodes(domains, replicas=1)
    assert partners == {0: [2], 2: [1], 1: [3], 3: [0]}
    assert all(domains[p] != domains[n] for n, (p,) in partners.items())
    # Three zones, two copies: each node's two copies sit in the two other zones.
    three = ["c", "a", "b", "a", "b", "c"]
    for node, nodes in _partner_nodes(three, replicas=2).items():
        assert len({three[node], *(three[p] for p in nodes)}) == 3, (node, nodes)


def test_one_domain_or_none_falls_back_to_the_next_nodes_in_rank_order():
    for domains in (["zone-a"] * 3, [""] * 3):
        assert node_ring(domains) == [0, 1, 2]
        assert partner_ranks(1, **_layout(domains, 2)) == partner_ranks(
            1, world_size=6, ranks_per_node=2, replicas=2
        )
        assert partner_ranks(1, **_layout(domains, 2)) == [3, 5]


def _node(zone: str, *layers: str) -> str:
    """A node's domain from its labels, as the trainer builds it (training/checkpoint/domains.py)."""
    keys = [f"topology.k8s.aws/network-node-layer-{n}" for n in range(1, len(layers) + 1)]
    return domain({"topology.kubernetes.io/zone": zone, **dict(zip(keys, layers, strict=True))})


def _differ_at(a: str, b: str) -> int:
    """The coarsest level at which two domains differ (their depth if they never do)."""
    pa, pb = levels(a), levels(b)
    depth = max(len(pa), len(pb))
    pa, pb = pa + [""] * (depth - len(pa)), pb + [""] * (depth - len(pb))
    return next((level for level in range(depth) if pa[level] != pb[level]), depth)


def test_in_one_zone_the_ring_alternates_the_network_nodes_the_nodes_hang_from():
    """A p5 job: one zone, one layer-1 and layer-2 node, eight nodes under two layer-3 nodes, the first
    four (by rank) under one. Every node's copy goes under the other switch."""
    domains = [_node("use1-az4", "nn-e504", "nn-9a8b", "nn-0123" if n < 4 else "nn-0fed") for n in range(8)]
    assert node_ring(domains) == [0, 4, 1, 5, 2, 6, 3, 7]
    for node, (partner,) in _partner_nodes(domains, replicas=1).items():
        assert _differ_at(domains[node], domains[partner]) == 3, (node, partner)


@pytest.mark.parametrize("level", [0, 2], ids=["two zones", "two layer-2 nodes in one zone"])
def test_the_ring_alternates_the_coarsest_level_and_within_each_group_the_next_one(level):
    """Two groups at `level` (zones, or layer-2 nodes of one zone), each with two layer-3 nodes: a node's
    first copy goes to the other group, its second stays in its group but under another layer-3 node.
    The groups' domains taken as flat names (four of them) put same-group nodes next to each other."""
    layout = [("a", "x"), ("a", "x"), ("a", "y"), ("a", "y"), ("b", "z"), ("b", "z"), ("b", "w"), ("b", "w")]

    def node(group: str, switch: str) -> str:
        if level == 0:
            return _node(f"use1-az{group}", "nn-1", "nn-2", f"nn-3{switch}")
        return _node("use1-az4", "nn-1", f"nn-2{group}", f"nn-3{switch}")

    domains = [node(group, switch) for group, switch in layout]
    for n, (first, second) in _partner_nodes(domains, replicas=2).items():
        assert _differ_at(domains[n], domains[first]) == level, (n, first, node_ring(domains))
        assert _differ_at(domains[n], domains[second]) == 3, (n, second, node_ring(domains))


@pytest.mark.parametrize(
    "domains",
    [
        # Uneven switches in one zone; a node whose network labels were not read (its zone alone).
        [_node("z", "l1", "l2", s) for s in "aaaaab"] + ["z"],
        # Two zones of unequal size, the network nodes differing at layer 1 in one of them.
        [
            _node("z1", "p", "q", "r"),
            _node("z1", "s", "q", "r"),
            _node("z1", "p", "q", "t"),
            _node("z2", "u"),
        ],
        # Four layers (the instance types that have them), and a node with no label at all.
        [_node("z", "l1", "l2", "l3", s) for s in "abab"] + [""],
    ],
)
@pytest.mark.parametrize("replicas", [1, 2])
def test_hierarchical_domains_keep_every_node_sending_and_holding_exactly_r_copies(domains, replicas):
    layout = _layout(domains, replicas)
    ring = node_ring(domains)
    assert sorted(ring) == list(range(len(domains)))
    assert node_ring(list(domains)) == ring  # a function of the domains alone: the same on every rank
    held = dict.fromkeys(range(layout["world_size"]), 0)
    for rank in range(layout["world_size"]):
        targets = partner_ranks(rank, **layout)
        assert len(set(targets)) == replicas
        for target in targets:
            held[target] += 1
            assert rank in source_ranks(target, **layout)
    assert set(held.values()) == {replicas}


@pytest.mark.parametrize(
    "domains",
    [["a", "a", "a", "b"], ["b", "a", "c", "a", "a"], ["x", "y"] * 3, ["a", "b", "c", "d", "a"]],
)
@pytest.mark.parametrize("replicas", [1, 2])
def test_every_node_sends_and_holds_exactly_r_copies_and_sources_mirror_partners(domains, replicas):
    """Uneven domains never pile copies onto one node: the memory each node needs stays R snapshots."""
    layout = _layout(domains, replicas)
    held = dict.fromkeys(range(layout["world_size"]), 0)
    for rank in range(layout["world_size"]):
        targets = partner_ranks(rank, **layout)
        assert len(set(targets)) == replicas
        assert all(t // 2 != rank // 2 and t % 2 == rank % 2 for t in targets)
        for target in targets:
            held[target] += 1
            assert rank in source_ranks(target, **layout)
    assert set(held.values()) == {replicas}
    # Each node's first copy is in another domain wherever the sizes allow: a domain holding more than
    # half the nodes must neighbour itself, every other node's neighbours are elsewhere.
    n, largest = len(domains), max(domains.count(d) for d in domains)
    crossing = sum(domains[partner_ranks(2 * i, **layout)[0] // 2] != d for i, d in enumerate(domains))
    assert crossing == min(n, 2 * (n - largest)), node_ring(domains)


def _report(
    own: dict[str, list[int]], serves: list[tuple[int, int]], *, world_size: int = 4, key: str = "k"
) -> dict:
    """What a rank reports (restore.py): each copy with the layout it was written at."""
    written = (world_size, key)
    return {
        "own": {tier: dict.fromkeys(steps, written) for tier, steps in own.items()},
        "serves": dict.fromkeys(serves, written),
    }


def _plan(reports, *, world_size, excluded, keys=None):
    plans = _plans(reports, keys or [(world_size, "k")] * world_size, excluded)
    return plans[0] if plans else None


def test_a_replacement_node_takes_its_shards_from_its_partners_ram():
    # Node 1 (ranks 2, 3) was replaced: nothing of its own; node 0 holds its copies of steps 8 and 10.
    reports = [
        _report({"memory": [8, 10], "durable": [0]}, [(0, 8), (0, 10), (1, 8), (1, 10), (2, 10), (3, 10)]),
        _report({"memory": [8, 10], "durable": [0]}, [(0, 8), (0, 10), (1, 8), (1, 10), (2, 10), (3, 10)]),
        _report({"durable": [0]}, []),
        _report({"durable": [0]}, []),
    ]
    plan = _plan(reports, world_size=4, excluded=set())
    assert plan is not None
    assert plan.step == 10
    assert plan.where == {
        0: ("memory", 0),
        1: ("memory", 1),
        2: ("peer_memory", 0),
        3: ("peer_memory", 0),
    }


def test_without_any_copy_in_ram_the_newest_common_step_comes_from_disk():
    # A node and its only partner both lost: no RAM holds anything; durable has 0 and 10, local 20 on
    # one rank only.
    reports = [_report({"durable": [0, 10], "local": [20] if r == 0 else []}, []) for r in range(4)]
    plan = _plan(reports, world_size=4, excluded=set())
    assert plan is not None
    assert (plan.step, {tier for tier, _ in plan.where.values()}) == (10, {"durable"})
    # A step that failed to verify somewhere is dropped for everyone.
    assert _plan(reports, world_size=4, excluded={10}).step == 0
    assert _plan(reports, world_size=4, excluded={0, 10}) is None


def test_own_ram_beats_a_partners_and_a_partners_beats_disk():
    reports = [
        _report({"memory": [6], "local": [6], "durable": [6]}, [(0, 6), (1, 6)], world_size=2),
        _report({"local": [6], "durable": [6]}, [], world_size=2),
    ]
    plan = _plan(reports, world_size=2, excluded=set())
    assert plan.where == {0: ("memory", 0), 1: ("peer_memory", 0)}


def test_copies_of_another_layout_are_never_loaded_byte_for_byte():
    # The same world size, another parallel layout (a new mesh): RAM and disk hold step 6 at layout "a",
    # the job now runs layout "b". Without a shared tier holding it whole, nothing can be loaded.
    reports = [_report({"memory": [6], "local": [6]}, [(r, 6)], world_size=2, key="a") for r in range(2)]
    assert _plan(reports, world_size=2, excluded=set(), keys=[(2, "b"), (2, "b")]) is None
    # A durable copy of the whole step, written by 4 ranks: resharded into this job's layout.
    reports[0]["whole"] = {"durable": {6: 4}}
    plan = _plan(reports, world_size=2, excluded=set(), keys=[(2, "b"), (2, "b")])
    assert (plan.step, plan.reshard_tier, plan.old_world_size, plan.where) == (6, "durable", 4, {})


def test_a_newer_whole_step_beats_an_older_one_at_this_layout():
    # A job of 4 ranks restarted with 2: step 4 exists at this layout (its own earlier run), step 8 only
    # whole on durable, from the 4-rank job: the newer state wins, resharded.
    reports = [_report({"durable": [4]}, [], world_size=2) for _ in range(2)]
    reports[0]["whole"] = {"durable": {4: 2, 8: 4}}
    plans = _plans(reports, [(2, "k"), (2, "k")], set())
    assert [(p.step, p.reshard_tier or "same") for p in plans] == [(8, "durable"), (4, "same")]


def _slot(folder, index: int, *, step: int, rank: int, world_size: int, data: bytes, header: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"slot-{index}.bin").write_bytes(data)
    (folder / f"slot-{index}.hdr").write_bytes(header)
    manifest = {"step": step, "rank": rank, "world_size": world_size, "data_bytes": len(data), "layout": "k"}
    (folder / f"slot-{index}.json").write_text(json.dumps(manifest))


def test_node_memory_lists_own_slots_and_partners_copies_with_their_layout(tmp_path):
    _slot(tmp_path / "rank-00000", 0, step=4, rank=0, world_size=4, data=b"own", header=b"H")
    _slot(tmp_path / "peer" / "rank-00002", 1, step=4, rank=2, world_size=4, data=b"copy", header=b"h")
    _slot(tmp_path / "rank-00001", 0, step=2, rank=1, world_size=8, data=b"old", header=b"x")  # other size
    (tmp_path / "peer" / "rank-00003").mkdir(parents=True)
    (tmp_path / "peer" / "rank-00003" / "slot-0.json").write_text("{torn")  # not committed
    held = node_memory(tmp_path)
    assert {key: (h.kind, h.layout) for key, h in held.items()} == {
        (0, 4): ("memory", (4, "k")),
        (2, 4): ("peer_memory", (4, "k")),
        (1, 2): ("memory", (8, "k")),
    }
    assert bytes(read_slot(held[(2, 4)])) == b"hcopy"
    (tmp_path / "peer" / "rank-00002" / "slot-1.bin").write_bytes(b"c")  # shorter than its manifest
    with pytest.raises(ShardError):
        read_slot(held[(2, 4)])
