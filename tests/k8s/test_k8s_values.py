"""Each bad-values case ends in one message naming the field (and exit code 2 from the CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from k8s.load import load_values
from kitcore.configio import UserError
from kitcore.pins import IMAGE

LOCAL = Path(__file__).resolve().parents[2] / "k8s" / "values" / "local-cpu.yaml"
P5 = LOCAL.with_name("p5-2.yaml")


@pytest.mark.parametrize(
    ("values", "overrides", "message"),
    [
        (LOCAL, ["num_nodes=0"], "num_nodes: Input should be greater than or equal to 1"),
        (LOCAL, ["spares=-1"], "spares: Input should be greater than or equal to 0"),
        (LOCAL, ["instance_profile=p9.huge"], "instance_profile: unknown instance type 'p9.huge'"),
        (LOCAL, ["mode=elastic"], "mode: Input should be 'baseline', 'inprocess', 'ft_launcher' or 'both'"),
        (LOCAL, ["name=Bad_Name"], "name: 'Bad_Name' must be a DNS label"),
        (
            LOCAL,
            ["budgets.inprocess_max_iterations=10"],
            "inprocess_max_iterations (10) must be below launcher_max_restarts (10)",
        ),
        (
            LOCAL,
            ["budgets.job_backoff_limit_per_index=10"],
            "launcher_max_restarts (10) must be below job_backoff_limit_per_index (10)",
        ),
        (
            LOCAL,
            ["budgets.expected_node_losses=11", "budgets.job_backoff_limit_per_index=13"],
            "launcher_max_restarts (10) must cover expected_node_losses (11)",
        ),
        (
            LOCAL,
            ["storage.memory_tier_gib=3"],
            "storage.memory_tier_gib: /dev/shm (1 GiB) + memory tier (3 GiB) exceed the pod's memory (3 GiB",
        ),
        (LOCAL, ["trainer.checkpoint.memory_dir=/dev/shm/x"], "checkpoint.memory_dir is set by the chart"),
        (LOCAL, ["timeouts.rdzv_join_s=30"], "rdzv_join_s (30) must exceed pod_reschedule_s (60)"),
        (
            LOCAL,
            ["timeouts.launcher_initial_heartbeat_s=5"],
            "launcher_initial_heartbeat_s (5) must be at least launcher_heartbeat_s (6)",
        ),
        (LOCAL, ["nvrx_version=0.1.0", "mode=inprocess"], "NVRx 0.1.0 lacks it"),
        (LOCAL, ["nvrx_version=banana"], "nvrx_version 'banana' is not a version number"),
        (LOCAL, ["instance_profile=p5.48xlarge"], "image: local runs on this machine's CPUs"),
        (LOCAL, ["env.AWS_SECRET_ACCESS_KEY=x"], "AWS_SECRET_ACCESS_KEY looks like a secret"),
        (LOCAL, ["trainer.run_dir=/tmp/x"], "run_dir is set by the chart"),
        (LOCAL, ["trainer.model=gigantic"], "trainer: trainer config: 1 invalid value(s)"),
        (LOCAL, ["trainer.no_such_flag=1"], "trainer: unrecognized arguments: --no-such-flag"),
        (
            LOCAL,
            ["timeouts.launcher_heartbeat_s=4"],
            "launcher_heartbeat_s (4) must exceed one in-process recovery",
        ),
        (LOCAL, ["storage.fsx_mount_path=fsx"], "storage.fsx_mount_path: 'fsx' must be an absolute path"),
    ],
)
def test_bad_values_message(values, overrides, message):
    with pytest.raises(UserError) as info:
        load_values(values, overrides)
    assert message in str(info.value)


def test_all_example_values_load():
    for path in sorted(LOCAL.parent.glob("*.yaml")):
        assert load_values(path).num_nodes >= 1


def test_local_image_uses_installed_nvrx_and_p5_uses_pin():
    assert load_values(LOCAL).resolved_nvrx_version == "0.4.1"
    assert load_values(P5).resolved_nvrx_version == IMAGE.nvrx_version


def test_cli_bad_values_exit_2_without_traceback(tmp_path, nvrx_eks):
    render = ("job", "render", "-f", str(LOCAL), "-o", str(tmp_path))
    proc = nvrx_eks(*render, "--set", "num_nodes=0", timeout=120)
    assert proc.returncode == 2
    assert "num_nodes" in proc.stderr
    assert "Traceback" not in proc.stderr
