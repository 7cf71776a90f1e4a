from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from children import run_python

from nvrx_eks.kitcore.ports import ReservedPort
from nvrx_eks.localrun.runtimes import RUNTIME_ENV
from nvrx_eks.node import use_pinned_node

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Iterator

    from nvrx_eks.localrun.executor import JobResult

REPO = Path(__file__).resolve().parents[1]
REFERENCES = REPO / "runs" / ".cache"
"""Fault-free references, shared by the tests, the demo and the image check of this checkout: one file
per job values (faults removed), trainer code and torch and NVRx release (localrun/chaos.py
`fault_free_key`), so a reference is run once, not once per test module and run of the suite."""

# The suite's local jobs (and the CLI commands it starts) fork each pod's `python -m` containers from a
# warm interpreter (localrun/warm.py): the same containers, a fraction of the start-up CPU. A run that
# sets the variable keeps its choice; tests/localrun/test_localrun_warm.py runs both runtimes.
os.environ.setdefault(RUNTIME_ENV, "warm")

# jsii (aws-cdk-lib, cdk8s) starts `node` from PATH: the pinned Node LTS, as `make test` and the
# console script do, for a bare `pytest` run and the subprocesses tests start.
use_pinned_node()


def _cuda_available() -> bool:
    try:
        import torch  # noqa: PLC0415 - optional at collection time
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the order counts what runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Files in the order the workers take them (`--dist loadfile --no-loadscope-reorder`): those with
    the most tests marked `long` first, then those with the most tests; a file keeps its own order.

    By number of tests alone (xdist's own order), a file of one test that runs for minutes comes last
    and ends its phase alone while the other worker idles."""
    counts: dict[Path, tuple[int, int]] = {}
    for item in items:
        long_tests, tests = counts.get(item.path, (0, 0))
        counts[item.path] = (long_tests + (item.get_closest_marker("long") is not None), tests + 1)
    items.sort(key=lambda item: (-counts[item.path][0], -counts[item.path][1]))


@pytest.fixture
def nvrx_eks() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`nvrx-eks ARGS...` as a user types it, in a child process from the repository root (or `cwd`);
    output captured, 200 columns wide; `piped=True`: as into a pipe or a file, no width given (Rich's 80);
    `env`: variables the user has set beside this machine's."""

    def run(
        *args: str, timeout: float, piped: bool = False, cwd: Path = REPO, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = (
            {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"PYTHONUNBUFFERED": "1"} | (env or {})
        )
        return run_python(
            "-m",
            "nvrx_eks",  # the console script's main (nvrx_eks/__main__.py), a warm fork (tests/children.py)
            *args,
            timeout=timeout,
            cwd=cwd,
            env=env if piped else env | {"COLUMNS": "200"},
        )

    return run


@pytest.fixture
def reserve_port() -> Iterator[Callable[[], int]]:
    """`reserve_port()`: a TCP port no other socket can take until the test ends (kitcore/ports.py), for a
    server the test starts later (its own, or a child's) to bind with address reuse, or for a port nothing
    may listen on. A port merely found free was taken, now and then, by another worker's socket before
    the test's server bound it."""
    with contextlib.ExitStack() as holds:
        yield lambda: holds.enter_context(ReservedPort()).port


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials from the standard chain (env vars), and no user config files or other source
    of credentials (a profile, a container's endpoint, a web identity) for the chain to find first."""
    for var in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


class LocalJobRunner:
    """The rendered local job (k8s/values/local-cpu.yaml plus overrides) run by the local executor, as
    `nvrx-eks local run` runs it: the fault tests of tests/training and tests/localrun share it."""

    values = REPO / "k8s" / "values" / "local-cpu.yaml"
    sync_durable_every_2 = (
        "trainer.checkpoint.implementation=sync",
        "trainer.checkpoint.durable_every=2",
        "trainer.checkpoint.local_every=0",
    )
    """The fault tests' checkpointing: the synchronous reference checkpointer, durable every 2 steps."""

    def run(
        self,
        run_dir: Path,
        overrides: list[str],
        *,
        timeout_s: float,
        node_provision_s: float = 0.0,
        must_succeed: bool = True,
    ) -> tuple[JobResult, Path]:
        """(the executor's result, the trainer's events folder); never leaves a process behind."""
        from nvrx_eks.k8s.job_chart import render  # noqa: PLC0415 - heavy imports, only in the tests that run jobs
        from nvrx_eks.k8s.load import load_values  # noqa: PLC0415
        from nvrx_eks.localrun.chaos import trainer_run_dir  # noqa: PLC0415
        from nvrx_eks.localrun.executor import marked_processes, run_local  # noqa: PLC0415

        values = load_values(self.values, overrides)
        render(values, str(run_dir / "dist"))
        result = run_local(
            run_dir / "dist", run_dir=run_dir, timeout_s=timeout_s, node_provision_s=node_provision_s
        )
        left = marked_processes(result.run_key)
        assert not left, f"processes left behind: {[(p.pid, p.name()) for p in left]}"
        if must_succeed:
            assert result.succeeded, f"{result.reason}; pod logs in {run_dir}"
        return result, trainer_run_dir(values, run_dir)

    def fault_free_hash(self, run_dir: Path, overrides: list[str], *, timeout_s: float) -> str:
        """The final-parameter hash of the local job with `overrides` and no faults: from REFERENCES,
        else run once and kept there (the demo's own cache format)."""
        from nvrx_eks.k8s.load import load_values  # noqa: PLC0415
        from nvrx_eks.localrun.chaos import fault_free_key  # noqa: PLC0415

        cached = REFERENCES / f"fault-free-{fault_free_key(load_values(self.values, overrides))}.json"
        if cached.exists():
            return str(json.loads(cached.read_text())["final_params_sha256"])
        _, events = self.run(run_dir, overrides, timeout_s=timeout_s)
        sha = self.final_hash(events)
        REFERENCES.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps({"final_params_sha256": sha, "run_dir": str(run_dir)}) + "\n")
        return sha

    @staticmethod
    def events(events_dir: Path, kind: str) -> list[dict[str, Any]]:
        """Every rank's events of one kind (training/events.py), in no particular order."""
        lines = (line for path in events_dir.rglob("rank-*.jsonl") for line in path.read_text().splitlines())
        return [event for event in map(json.loads, lines) if event["kind"] == kind]

    @staticmethod
    def newest_step_on_disk(events: list[dict[str, Any]], tier: str, *, before_t: float) -> int:
        """The newest step every rank had reported committed to disk tier `tier` by `before_t` (-1: none).

        What a restart after a loss at `before_t` must resume from at least: a commit's event comes after
        its write, so a step can be on disk before its event, never the other way round. Not "at most
        one cadence back": a write still running at the loss leaves the step before it the newest."""
        ranks = {e["rank"] for e in events if e["kind"] == "process_start"}
        steps: dict[int, set[int]] = {rank: set() for rank in ranks}
        for e in events:
            if e["kind"] == "checkpoint_committed" and e["tier"] == tier and e["t"] <= before_t:
                steps[e["rank"]].add(e["step"])
        newest = max(set.intersection(*steps.values()), default=-1) if steps else -1
        assert newest >= 0, f"no {tier} step on every rank's disk before the loss: the test's premise failed"
        return newest

    @staticmethod
    def final_hash(events_dir: Path) -> str:
        return json.loads((events_dir / "final.json").read_text())["final_params_sha256"]


@pytest.fixture(scope="session")
def references() -> Path:
    """REFERENCES, for the tests that hand it to a command (`nvrx-eks demo --cache`)."""
    return REFERENCES


@pytest.fixture(scope="session")
def local_job() -> LocalJobRunner:
    return LocalJobRunner()
