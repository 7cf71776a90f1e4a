"""Where each shard comes from at restore (training/checkpoint/restore_anywhere.py), and who holds whose
copies (training/checkpoint/replica.py)."""

from __future__ import annotations

import json

import pytest

from training.checkpoint.replica import node_ring, partner_ranks, source_ranks
from training.checkpoint.restore_anywhere import _plan, node_memory, read_slot
from training.checkpoint.shard import ShardError


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


def _report(own: dict[str, list[int]], serves: list[tuple[int, int]]) -> dict:
    return {"own": own, "serves": serves}


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
        _report({"memory": [6], "local": [6], "durable": [6]}, [(0, 6), (1, 6)]),
        _report({"local": [6], "durable": [6]}, []),
    ]
    plan = _plan(reports, world_size=2, excluded=set())
    assert plan.where == {0: ("memory", 0), 1: ("peer_memory", 0)}


def _slot(folder, index: int, *, step: int, rank: int, world_size: int, data: bytes, header: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"slot-{index}.bin").write_bytes(data)
    (folder / f"slot-{index}.hdr").write_bytes(header)
    manifest = {"step": step, "rank": rank, "world_size": world_size, "data_bytes": len(data)}
    (folder / f"slot-{index}.json").write_text(json.dumps(manifest))


def test_node_memory_lists_own_slots_and_partners_copies_of_this_job_layout(tmp_path):
    _slot(tmp_path / "rank-00000", 0, step=4, rank=0, world_size=4, data=b"own", header=b"H")
    _slot(tmp_path / "peer" / "rank-00002", 1, step=4, rank=2, world_size=4, data=b"copy", header=b"h")
    _slot(tmp_path / "rank-00001", 0, step=2, rank=1, world_size=8, data=b"old", header=b"x")  # other layout
    (tmp_path / "peer" / "rank-00003").mkdir(parents=True)
    (tmp_path / "peer" / "rank-00003" / "slot-0.json").write_text("{torn")  # not committed
    held = node_memory(tmp_path, world_size=4)
    assert {key: kind for key, (kind, _) in held.items()} == {(0, 4): "memory", (2, 4): "peer_memory"}
    assert bytes(read_slot(held[(2, 4)][1], 4, 2)) == b"hcopy"
    with pytest.raises(ShardError):
        read_slot(held[(2, 4)][1], 6, 2)
