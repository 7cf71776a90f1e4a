"""Node loss restored from a partner's RAM: the rendered local job (2 nodes x 2 CPU ranks, the default
one peer replica) run by the executor, which plays the Job controller and replaces the deleted pod.

The replacement pod starts with an empty memory tier and no node-local disk; its ranks must take their
shards from the surviving node's RAM (tier `peer_memory`), lose no more than two memory snapshot
intervals (every snapshot is replicated, but its exchange starts once its copy is done and takes about
a step here: a loss one step after a snapshot may find only the one before), and end bit-identical to a
fault-free run.
With both nodes lost at once (a node and its only partner), the job falls back to the durable tier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k8s.job_chart import render
from k8s.load import load_values
from localrun.chaos import trainer_run_dir
from localrun.executor import marked_processes, run_local
from training.metrics import summarize

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "k8s/values/local-cpu.yaml"
STEPS = 40
MEMORY_EVERY = 2


def _run(run_dir: Path, plan: str) -> Path:
    overrides = [f"trainer.steps={STEPS}", f"trainer.checkpoint.memory_every={MEMORY_EVERY}"]
    if plan:
        overrides.append(f"trainer.faults.plan={plan}")
    values = load_values(LOCAL, overrides)
    render(values, str(run_dir / "dist"))
    result = run_local(run_dir / "dist", run_dir=run_dir, timeout_s=240)
    assert result.succeeded, f"{result.reason}; pod logs in {run_dir}"
    left = marked_processes(result.run_key)
    assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"
    return trainer_run_dir(values, run_dir)


def _final_hash(events_dir: Path) -> str:
    return json.loads((events_dir / "final.json").read_text())["final_params_sha256"]


@pytest.fixture(scope="module")
def fault_free_hash(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _final_hash(_run(tmp_path_factory.mktemp("reference"), ""))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rank", [0, 3], ids=["node-of-rank-0", "node-of-rank-3"])
def test_a_lost_node_comes_back_from_its_partners_ram(tmp_path, fault_free_hash, rank):
    events = _run(tmp_path, f"node_loss@21:{rank}")
    (fault,) = summarize(events).faults
    assert fault.layer == "job_controller", fault
    assert fault.tier == "peer_memory", fault
    assert fault.steps_lost is not None, fault
    assert fault.steps_lost <= 2 * MEMORY_EVERY, fault
    assert _final_hash(events) == fault_free_hash


@pytest.mark.timeout(300)
def test_a_node_and_its_only_partner_lost_together_fall_back_to_durable(tmp_path, fault_free_hash):
    events = _run(tmp_path, "node_loss@25:0,node_loss@25:3")
    faults = summarize(events).faults
    assert {f.tier for f in faults} == {"durable"}, faults
    # Durable every 10 steps (local-cpu values): the newest durable step is at most that far back.
    assert max(f.steps_lost or 0 for f in faults) <= 10, faults
    assert _final_hash(events) == fault_free_hash
