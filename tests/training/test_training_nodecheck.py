"""`training.node.nodecheck`: the node-check DaemonSet's checks and its verdict on the Node, against fakes.

The fakes are the API server (merge patches applied as RFC 7386 says, conditions merged by type as
a strategic merge patch does), the tools (nvidia-smi, dcgmi answering or hanging) and device trees.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import subprocess
import sys
from typing import Any

import pytest
from kube_objects import merge_patch

from nvrx_eks.kitcore.profiles import get_profile
from nvrx_eks.training.node import nodecheck
from nvrx_eks.training.node.nodecheck import (
    CONDITION_TYPE,
    UNVERIFIED_TAINT,
    VERIFIED_AT_LABEL,
    VERIFIED_LABEL,
    ApiError,
    CommandResult,
    CommandTimeoutError,
    Host,
    Status,
)

P5 = get_profile("p5.48xlarge")
NAME = "ip-10-0-1-23.ec2.internal"


class FakeApi:
    """One Node; counts calls; can refuse the next patch with a status code."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node
        self.events: list[dict[str, Any]] = []
        self.fail_next: list[int] = []
        self.version = 1

    def get_node(self, name: str) -> dict[str, Any]:
        assert name == NAME
        if self.fail_next and self.fail_next[0] >= 500:
            raise ApiError(self.fail_next.pop(0), "unavailable")
        return copy.deepcopy(
            self.node | {"metadata": self.node["metadata"] | {"resourceVersion": str(self.version)}}
        )

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        assert name == NAME
        if self.fail_next:
            raise ApiError(self.fail_next.pop(0), "conflict")
        assert patch["metadata"]["resourceVersion"] == str(self.version)
        body = copy.deepcopy(patch)
        body["metadata"].pop("resourceVersion")
        self.node = merge_patch(self.node, body)
        self.version += 1

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> None:
        assert name == NAME
        conditions = {c["type"]: c for c in self.node.get("status", {}).get("conditions", [])}
        for condition in patch["status"]["conditions"]:
            conditions[condition["type"]] = condition
        self.node.setdefault("status", {})["conditions"] = list(conditions.values())

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        assert namespace == "nvrx-system"
        self.events.append(body)

    @property
    def labels(self) -> dict[str, str]:
        return self.node["metadata"].get("labels", {})

    @property
    def taints(self) -> list[dict[str, str]]:
        return self.node.get("spec", {}).get("taints", [])

    @property
    def condition(self) -> dict[str, Any]:
        (found,) = [c for c in self.node["status"]["conditions"] if c["type"] == CONDITION_TYPE]
        return found


def _node(instance_type: str = "p5.48xlarge", *, agent: str = "True") -> dict[str, Any]:
    return {
        "metadata": {
            "name": NAME,
            "uid": "u-1",
            "labels": {nodecheck.INSTANCE_TYPE_LABEL: instance_type, "nvrx-eks/gpu": "true"},
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                *(
                    {"type": t, "status": agent if t == "AcceleratedHardwareReady" else "True", "reason": "R"}
                    for t in nodecheck.AGENT_CONDITIONS
                ),
            ]
        },
    }


def _smi_rows(count: int, ecc: int = 0) -> str:
    return "".join(f"{i}, 00000000:{i:02X}:00.0, {ecc if i == 3 else 0}\n" for i in range(count))


def _nvlink(gpus: int, links: int = 18, down: tuple[int, int] | None = None) -> str:
    lines = []
    for g in range(gpus):
        lines.append(f"GPU {g}: NVIDIA H100 80GB HBM3 (UUID: GPU-{g})")
        lines += [
            f"\t Link {n}: " + ("<inactive>" if (g, n) == down else "26.562 GB/s") for n in range(links)
        ]
    return "\n".join(lines) + "\n"


DCGM_PASS = json.dumps({"category": [{"tests": [{"name": "Deployment", "results": [{"status": "Pass"}]}]}]})


class Tools:
    """Fake command runner: argv prefix -> result, None (missing) or 'hang' (times out)."""

    def __init__(self, answers: dict[str, Any] | None = None) -> None:
        self.answers = {
            "nvidia-smi --query-gpu": CommandResult(0, _smi_rows(8), ""),
            "nvidia-smi nvlink": CommandResult(0, _nvlink(8), ""),
            "dcgmi diag": CommandResult(0, DCGM_PASS, ""),
        }
        self.answers.update(answers or {})
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: list[str], timeout_s: float) -> CommandResult | None:
        self.calls.append((list(argv), timeout_s))
        line = " ".join(argv)
        answer = next((v for prefix, v in self.answers.items() if line.startswith(prefix)), None)
        if answer == "hang":
            raise CommandTimeoutError(f"{argv[0]} timed out after {timeout_s:g} s")
        return answer


class _Stat:
    def __init__(self, gib: float) -> None:
        self.f_frsize = 4096
        self.f_blocks = int(gib * (1 << 30) / 4096)


@pytest.fixture
def host(tmp_path) -> Host:
    """A healthy p5.48xlarge as the DaemonSet pod sees it."""
    sys_root, dev, host_dev = tmp_path / "sys", tmp_path / "dev", tmp_path / "host-dev"
    (host_dev / "infiniband").mkdir(parents=True)
    dev.mkdir()
    drivers = sys_root / "bus" / "pci" / "drivers" / "efa"
    drivers.mkdir(parents=True)
    for i in range(8):
        (dev / f"nvidia{i}").touch()
    for i in range(P5.efa_devices):
        device = sys_root / "class" / "infiniband" / f"rdmap{i}s0" / "device"
        device.mkdir(parents=True)
        (device / "driver").symlink_to(drivers)
        (host_dev / "infiniband" / f"uverbs{i}").touch()
    plugin_dir = tmp_path / "opt" / "aws-ofi-nccl" / "lib"
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "libnccl-net-ofi.so").touch()
    return Host(
        gpu_dev_root=dev,
        sys_root=sys_root,
        efa_dev_root=host_dev,
        nvme_path=tmp_path / "nvme",
        run=Tools(),
        statvfs=lambda _path: _Stat(P5.nvme_total_gib * 0.98),
        # The training image's environment, the limit the GPU nodes' NodeConfig gives every container,
        # and a plugin that loads (the placeholder file stands in for it).
        env={"NCCL_NET_PLUGIN": "ofi", "LD_LIBRARY_PATH": str(plugin_dir)},
        memlock=lambda: resource.RLIM_INFINITY,
        load_library=lambda _path: None,
    )


def _round(api: FakeApi, host: Host) -> nodecheck.Verdict:
    return nodecheck.verify_once(api, host, node_name=NAME, namespace="nvrx-system")


def test_a_healthy_node_is_labelled_verified_with_a_time_and_one_event(host):
    api = FakeApi(_node())
    result = _round(api, host)
    assert result.passed, result.message
    assert {c.name: c.status for c in result.checks} == {
        "profile": Status.OK,
        "GPUs": Status.OK,
        "DCGM diag": Status.OK,
        "NVLink": Status.OK,
        "EFA devices": Status.OK,
        "memlock limit": Status.OK,
        "NCCL net plugin": Status.OK,
        "local NVMe": Status.OK,
        "node conditions": Status.OK,
    }
    assert api.labels[VERIFIED_LABEL] == "true"
    assert len(api.labels[VERIFIED_AT_LABEL]) == len("20261201T100705Z")
    assert api.labels["nvrx-eks/gpu"] == "true"  # other labels untouched
    assert api.taints == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    assert api.condition["status"] == "True"
    assert api.condition["reason"] == "ChecksPassed"
    (event,) = api.events
    assert (event["type"], event["involvedObject"]["kind"], event["involvedObject"]["name"]) == (
        "Normal",
        "Node",
        NAME,
    )
    report = json.loads(api.node["metadata"]["annotations"][nodecheck.REPORT_ANNOTATION])
    assert report["passed"] is True
    assert len(report["checks"]) == 9
    # The next round: same verdict, no new event, the transition time kept.
    transition = api.condition["lastTransitionTime"]
    assert _round(api, host).passed
    assert len(api.events) == 1
    assert api.condition["lastTransitionTime"] == transition


def test_a_missing_gpu_taints_the_node_and_recovery_lifts_the_taint(host):
    api = FakeApi(_node())
    assert _round(api, host).passed
    host.run.answers["nvidia-smi --query-gpu"] = CommandResult(0, _smi_rows(7), "")
    result = _round(api, host)
    assert not result.passed
    assert result.reason == "GPUCheckFailed"
    assert "7 of 8 GPUs" in result.message
    assert api.labels[VERIFIED_LABEL] == "false"
    assert VERIFIED_AT_LABEL not in api.labels  # a stale time would read as verified
    assert {"key": UNVERIFIED_TAINT, "value": "GPUCheckFailed", "effect": "NoSchedule"} in api.taints
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in api.taints
    assert api.condition["status"] == "False"
    assert [e["type"] for e in api.events] == ["Normal", "Warning"]
    host.run.answers["nvidia-smi --query-gpu"] = CommandResult(0, _smi_rows(8), "")
    assert _round(api, host).passed
    assert [t["key"] for t in api.taints] == ["nvidia.com/gpu"]
    assert api.labels[VERIFIED_LABEL] == "true"
    assert len(api.events) == 3


@pytest.mark.parametrize(
    ("fault", "reason", "words"),
    [
        ("memlock", "MemlockLimitTooLow", "EFA memory registration would fail"),
        ("plugin", "NcclNetPluginUnusable", "it needs libfabric.so.1, which the image lacks"),
    ],
)
def test_what_the_self_check_would_refuse_on_any_node_keeps_work_off_the_node(host, fault, reason, words):
    """A memlock limit below what EFA needs, or a net plugin that does not load, fails every training
    pod's self-check on the node whatever its hardware: the node check fails it first, so the node
    takes no pod and its condition names the cause before a job is submitted."""
    if fault == "memlock":
        host.memlock = lambda: 64 * 1024
    else:
        host.load_library = lambda path: (
            f"{path}: libfabric.so.1: cannot open shared object file: No such file"
        )
    api = FakeApi(_node())
    result = _round(api, host)
    assert not result.passed
    assert result.reason == reason
    assert words in result.message
    assert {"key": UNVERIFIED_TAINT, "value": reason, "effect": "NoSchedule"} in api.taints


def test_uncorrected_ecc_fails_the_gpu_check(host):
    host.run.answers["nvidia-smi --query-gpu"] = CommandResult(0, _smi_rows(8, ecc=2), "")
    result = _round(FakeApi(_node()), host)
    assert result.reason == "GPUCheckFailed"
    assert "GPU 3" in result.message


def test_missing_dcgmi_is_a_clear_skip_and_the_node_still_verifies(host):
    host.run.answers["dcgmi diag"] = None
    result = _round(FakeApi(_node()), host)
    assert result.passed
    (dcgm,) = [c for c in result.checks if c.name == "DCGM diag"]
    assert dcgm.status is Status.SKIP
    assert "not installed" in dcgm.detail


def test_a_hanging_dcgm_diag_is_a_timeout_condition_not_a_crash(host):
    host.run.answers["dcgmi diag"] = "hang"
    api = FakeApi(_node())
    result = _round(api, host)
    assert result.reason == "DCGMDiagFailed"
    assert "timed out after 300 s" in result.message
    assert "timed out" in api.condition["message"]
    # dcgmi got its own (longer) time, nvidia-smi the short one.
    assert {argv[0]: t for argv, t in host.run.calls} == {"nvidia-smi": 60.0, "dcgmi": 300.0}


def test_a_failed_dcgm_test_is_named(host):
    failing = {"category": [{"tests": [{"name": "PCIe", "results": [{"status": "Fail"}]}]}]}
    host.run.answers["dcgmi diag"] = CommandResult(226, json.dumps(failing), "")
    result = _round(FakeApi(_node()), host)
    assert result.reason == "DCGMDiagFailed"
    assert "PCIe" in result.message


def test_an_inactive_nvlink_fails(host):
    host.run.answers["nvidia-smi nvlink"] = CommandResult(0, _nvlink(8, down=(5, 11)), "")
    result = _round(FakeApi(_node()), host)
    assert result.reason == "NVLinkDown"
    assert "GPU 5 link 11" in result.message


def test_missing_efa_devices_fail_against_the_profile(host):
    for path in list((host.efa_dev_root / "infiniband").glob("uverbs*"))[:4]:
        path.unlink()
    result = _round(FakeApi(_node()), host)
    assert result.reason == "EFADevicesMissing"
    assert "requested 32" in result.message


def test_an_nvme_array_missing_a_disk_fails(host):
    host.statvfs = lambda _path: _Stat(P5.nvme_total_gib * 7 / 8)
    result = _round(FakeApi(_node()), host)
    assert result.reason == "LocalNVMeUnusable"
    assert "degraded" in result.message


def test_the_nvme_check_looks_at_the_real_filesystem(host):
    host.statvfs = os.statvfs  # this machine's disk is far smaller than a p5's 28 TB array
    assert _round(FakeApi(_node()), host).reason == "LocalNVMeUnusable"
    assert not list(host.nvme_path.iterdir())  # the write probe left nothing behind


def test_a_false_agent_condition_fails(host):
    result = _round(FakeApi(_node(agent="False")), host)
    assert result.reason == "NodeConditionFalse"
    assert "AcceleratedHardwareReady=False" in result.message


def test_an_unknown_instance_type_is_not_verified(host):
    result = _round(FakeApi(_node("m5.large")), host)
    assert result.reason == "UnknownInstanceType"


def test_a_conflicting_patch_is_retried_on_a_fresh_read(host):
    api = FakeApi(_node())
    api.fail_next = [409]
    assert _round(api, host).passed
    assert api.labels[VERIFIED_LABEL] == "true"


def test_the_loop_survives_api_errors_and_checks_again(host):
    api = FakeApi(_node())
    api.fail_next = [503, 503]
    slept: list[float] = []
    nodecheck.loop(
        api, host, node_name=NAME, namespace="nvrx-system", interval_s=600, rounds=3, sleep=slept.append
    )
    assert slept == [nodecheck.RETRY_S, nodecheck.RETRY_S, 600]
    assert api.labels[VERIFIED_LABEL] == "true"
    # Whatever else goes wrong in a round (here: the API answers garbage) is retried, not fatal.
    broken = FakeApi(_node())
    broken.get_node = lambda _name: {"metadata": None}
    slept.clear()
    nodecheck.loop(
        broken, host, node_name=NAME, namespace="nvrx-system", interval_s=600, rounds=2, sleep=slept.append
    )
    assert slept == [nodecheck.RETRY_S, nodecheck.RETRY_S]


def test_real_commands_missing_or_hanging(tmp_path):
    assert nodecheck.run_command(["no-such-tool-nvrx"], 1.0) is None
    with pytest.raises(CommandTimeoutError, match=r"timed out after 0\.2 s"):
        nodecheck.run_command(["sleep", "5"], 0.2)
    assert nodecheck.run_command(["true"], 5.0) == CommandResult(0, "", "")


def test_once_outside_a_cluster_is_one_clear_message():
    done = subprocess.run(
        [sys.executable, "-m", "nvrx_eks.training.node.nodecheck", "--once", "--node", NAME],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"},
    )
    assert done.returncode == 2
    assert "KUBERNETES_SERVICE_HOST is unset" in done.stderr
    assert "Traceback" not in done.stderr
