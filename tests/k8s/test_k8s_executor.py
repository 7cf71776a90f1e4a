"""The local executor runs a tiny rendered job (2 pods x 2 CPU ranks) to the end, also when nodes die."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from k8s.executor import NodeDeletion, run_local
from k8s.job_chart import render
from k8s.values import load_values

LOCAL = Path(__file__).resolve().parents[2] / "k8s" / "values" / "local-cpu.yaml"
# ft_launcher mode: node loss is recovered by the launcher + Job controller, the layers under test here.
OVERRIDES = ["mode=ft_launcher", "trainer.steps=40", "trainer.dist.timeout_s=30"]


def _render(tmp_path: Path) -> Path:
    out = tmp_path / "dist"
    render(load_values(LOCAL, OVERRIDES), str(out))
    return out


def _steps_done(run_dir: Path) -> set[int]:
    steps = set()
    for path in (run_dir / "volumes").glob("pvc-*/runs/*/events/rank-*.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("kind") == "step":
                steps.add(event["step"])
    return steps


def _no_leftovers(run_dir: Path) -> None:
    mine = [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    assert not mine, f"processes left behind: {[p.pid for p in mine]}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tiny_job_completes_and_survives_node_loss_of_index_1_then_0(tmp_path):
    dist = _render(tmp_path)
    run_dir = tmp_path / "run"
    result = run_local(
        dist,
        run_dir=run_dir,
        deletions=[NodeDeletion(index=1, after_s=25), NodeDeletion(index=0, after_s=70)],
        timeout_s=270,
    )
    assert result.succeeded, (result.reason, [(p.pod, p.reason, p.exit_code) for p in result.pods])
    reasons = {p.pod: p.reason for p in result.pods}
    assert [d["index"] for d in result.deletions] == [1, 0]
    assert all("replacement" in d for d in result.deletions)
    assert sum(r == "NodeDeleted" for r in reasons.values()) == 2
    assert sum(p.reason == "Succeeded" for p in result.pods if p.index is not None) == 2
    assert max(_steps_done(run_dir)) == 40
    assert (run_dir / "job.json").exists()
    _no_leftovers(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_chaos_dir_request_deletes_node_and_config_error_fails_job(tmp_path):
    """Contract 7 (chaos dir) and podFailurePolicy: exit code 2 fails the job at once, no retries."""
    out = tmp_path / "dist"
    render(load_values(LOCAL, [*OVERRIDES, "trainer.steps=1"]), str(out))
    # A configuration error the launcher itself reports with exit code 2 (argparse). Note: ft_launcher
    # exits 1 when a worker fails, whatever the worker's code, so the trainer's own exit 2 never reaches
    # the pod's status; the FailJob rule sees launcher-level configuration errors.
    manifest = next(out.glob("*.yaml"))
    manifest.write_text(manifest.read_text().replace("--max-restarts=6", "--max-restarts=six", 1))
    chaos = tmp_path / "chaos"
    chaos.mkdir()
    (chaos / "delete-node-1").write_text('{"step": 0, "rank": 2, "time": 0}')
    result = run_local(out, run_dir=tmp_path / "run", chaos_dir=chaos, timeout_s=100)
    assert not result.succeeded
    assert "PodFailurePolicy" in result.reason
    assert list(chaos.glob("handled-delete-node-1-*"))
