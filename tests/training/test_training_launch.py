"""training/resilience/launch.py: ft_launcher's command line rewritten for workers forked from a warm
forkserver.

The speed-up itself is measured by `make demo` (the recovery phases table) and proven in the fault
tests (tests/training/test_training_faults.py: a restarted worker used a fraction of the CPU a fresh
interpreter does). Here: the rewrite, and the condition that makes a fork safe to share.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from children import environ_read_at_import, import_probe, run_python

from nvrx_eks.kitcore.configio import USER_ERROR_EXIT_CODE, UserError
from nvrx_eks.training.entry import entry_source
from nvrx_eks.training.resilience.config import ResilienceConfig
from nvrx_eks.training.resilience.launch import (
    S3_MODULES,
    WARM_MODULES,
    _flag,
    check_entry,
    entry_script,
    launcher_argv,
    start_method,
    warm_entry_imports,
    warm_modules,
)
from nvrx_eks.training.resilience.warm_entry import PRELOAD_IMPORTS_ENV, write_warm_module

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parents[2]
REFERENCE = ["--", "-m", "nvrx_eks.training"]
"""The training script after the renderer's `--`: the reference trainer, an entry point like any other."""


def test_the_training_script_after_the_separator_becomes_the_run_path_in_a_forkserver():
    argv = ["--nnodes=2:2", "--max-restarts=3", *REFERENCE, "--model", "tiny", "-m", "x"]
    assert launcher_argv(argv) == [
        "--nnodes=2:2",
        "--max-restarts=3",
        "--start-method=forkserver",
        "--run-path",
        entry_script(),
        "--module",
        "nvrx_eks.training",
        "--model",
        "tiny",
        "-m",
        "x",
    ]
    assert Path(entry_script()) == REPO / "training" / "entry.py"


def test_an_explicit_start_method_is_kept():
    argv = ["--start-method=spawn", *REFERENCE, "--steps", "3"]
    assert launcher_argv(argv)[:3] == ["--start-method=spawn", "--run-path", entry_script()]


@pytest.mark.parametrize(
    "given",
    [
        ["--start-method=spawn"],
        ["--start-method", "spawn"],
        ["--start_method=spawn"],
        ["--start_method", "spawn"],
    ],
)
def test_an_explicit_start_method_is_kept_in_every_spelling_ft_launcher_accepts(given):
    ft_argv = launcher_argv([*given, "--nnodes=1", *REFERENCE, "--steps", "3"])
    run = ["--run-path", entry_script(), "--module", "nvrx_eks.training"]
    assert ft_argv == [*given, "--nnodes=1", *run, "--steps", "3"]
    assert start_method(ft_argv) == "spawn"


@pytest.mark.parametrize("given", [["--start-method=forkserver"], ["--start-method", "forkserver"]])
def test_the_launcher_warms_the_forkserver_whichever_form_names_it(given, monkeypatch):
    """main() preloads and starts the forkserver when the command line asks for one, in either form."""
    import multiprocessing.forkserver  # noqa: PLC0415

    import nvidia_resiliency_ext.fault_tolerance.launcher as nvrx_launcher  # noqa: PLC0415

    from nvrx_eks.training.resilience import launch  # noqa: PLC0415

    warmed: list[object] = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", warmed.append)
    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", lambda: warmed.append("started"))
    monkeypatch.setattr(launch, "keep_launcher_process_group", lambda: None)
    monkeypatch.setattr(launch, "check_supported_nvrx", lambda: None)
    monkeypatch.setattr(launch, "hand_over", lambda ft_argv: None)
    monkeypatch.setattr(launch, "capture_worker_failures", dict)
    monkeypatch.setattr(launch, "report_every_failed_worker", lambda: None)
    monkeypatch.setattr(launch, "format_tracebacks_without_dynamo", lambda: None)
    monkeypatch.setattr(launch, "beat", lambda ft_argv: None)
    monkeypatch.setattr(launch, "poll_rendezvous_faster", lambda: None)
    monkeypatch.delenv("NVRX_EKS_CONFIG", raising=False)
    monkeypatch.delenv("NVRX_EKS_PRELOAD", raising=False)
    monkeypatch.setenv(PRELOAD_IMPORTS_ENV, "0")  # the entry point's own imports: tested below
    ran: list[list[str]] = []
    monkeypatch.setattr(nvrx_launcher, "main", ran.append)
    monkeypatch.setattr(sys, "argv", ["nvrx_eks.training.resilience.launch", *given, *REFERENCE])
    launch.main()
    assert warmed == [list(WARM_MODULES), "started"]
    assert ran == [[*given, "--run-path", entry_script(), "--module", "nvrx_eks.training"]]


def test_launcher_flags_are_read_in_both_forms_and_never_from_the_scripts_arguments():
    ft_argv = launcher_argv(["--rdzv-endpoint", "store:29400", "--rdzv_id=job", "--nnodes=2:3", *REFERENCE])
    read = [_flag([*ft_argv, "--nnodes", "9"], f) for f in ("--rdzv-endpoint", "--rdzv-id", "--nnodes")]
    assert read == ["store:29400", "job", "2:3"]
    assert _flag(launcher_argv([*REFERENCE, "--nnodes", "9"]), "--nnodes") is None
    assert start_method(launcher_argv([*REFERENCE, "--start-method", "spawn"])) == "forkserver"


@pytest.mark.parametrize(
    "argv",
    [
        ["--nnodes=1", "--rdzv-endpoint", "store:29400"],  # no separator
        ["--nnodes=1", "--"],  # nothing after it
        ["--nnodes=1", "--", "-m"],  # a module flag without its module
        ["--nnodes=1", "--", "--steps", "3"],  # a flag where the script belongs
    ],
)
def test_a_command_without_a_training_script_is_refused(argv):
    with pytest.raises(SystemExit, match=r"usage: .* FT_LAUNCHER_FLAGS -- \(-m MODULE \| SCRIPT\)"):
        launcher_argv(argv)


@pytest.mark.parametrize(
    ("entry", "run"),
    [
        (["-m", "examples.hf_llama.train"], ["--module", "examples.hf_llama.train"]),
        (["/workspace/train.py"], ["--script", "/workspace/train.py"]),
    ],
)
def test_any_module_or_script_runs_through_the_entry_shim_in_a_forked_worker(entry, run):
    # A bare word after a flag is its value or the script, by ft_launcher's own flags; the separator the
    # renderer writes says which, so `--standalone train.py` is never misread.
    flags = ["--nnodes", "2", "--standalone", "--rdzv-id=job"]
    ft_argv = launcher_argv([*flags, "--", *entry, "--steps", "80", "--nnodes", "9"])
    assert ft_argv == [
        *flags, "--start-method=forkserver", "--run-path", entry_script(), *run,
        "--steps", "80", "--nnodes", "9",
    ]  # fmt: skip
    assert _flag(ft_argv, "--nnodes") == "2"


# The variables ft_launcher sets per worker (torch.distributed.elastic's worker env and NVRx's rank
# monitor sockets): a forked worker gets them only after the fork, so nothing may read them at import.
PER_WORKER = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
}


def _read_at_import(modules: tuple[str, ...], cwd: Path) -> set[str]:
    return environ_read_at_import(modules, cwd=cwd)


def test_the_probe_sees_a_module_that_reads_the_rank_at_import(tmp_path):
    (tmp_path / "rank_at_import.py").write_text("import os\nRANK = int(os.environ.get('RANK', '0'))\n")
    assert "RANK" in _read_at_import(("rank_at_import",), tmp_path)


def test_nothing_the_forkserver_imports_reads_a_per_worker_variable():
    read = _read_at_import((*WARM_MODULES, *S3_MODULES), REPO)
    assert read, "the probe saw no reads at all: it does not watch the environment"
    assert not (read & PER_WORKER), sorted(read & PER_WORKER)
    launcher_wide = {
        # NVRx's launcher module warns at import when this deprecated variable is set: whoever starts
        # the launcher sets it or not, the same for the forkserver and every worker.
        "FT_LAUNCHER_LOGLEVEL",
    }
    assert not {k for k in read - launcher_wide if k.startswith(("FT_", "TORCHELASTIC_"))}, sorted(read)


_CUDA_PROBE = r"""
import json, sys, torch
calls = []
for name in ("is_available", "device_count", "_lazy_init", "init", "current_device", "set_device"):
    original = getattr(torch.cuda, name)
    def watch(*args, _original=original, _name=name, **kwargs):
        calls.append(_name)
        return _original(*args, **kwargs)
    setattr(torch.cuda, name, watch)
for name in sys.argv[1].split(","):
    __import__(name)
print(json.dumps(calls))
"""


def _cuda_calls(modules: tuple[str, ...], cwd: Path) -> list[str]:
    return import_probe(_CUDA_PROBE, modules, cwd=cwd)


def test_the_cuda_probe_sees_a_module_that_counts_devices_at_import(tmp_path):
    (tmp_path / "counts_gpus.py").write_text("import torch\nGPUS = torch.cuda.device_count()\n")
    assert "device_count" in _cuda_calls(("counts_gpus",), tmp_path)


def test_nothing_the_forkserver_imports_touches_cuda():
    # A process that initialised CUDA (even only to count devices, without PyTorch's NVML-based
    # check) forks children that cannot use it: the forkserver must never ask.
    assert _cuda_calls((*WARM_MODULES, *S3_MODULES), REPO) == []


def test_the_launchers_last_line_names_each_failed_rank_within_the_termination_message(tmp_path):
    """The pod's termination message is the log's last 2,048 bytes: ft_launcher's own line (call stacks
    included) cut off the SIGKILLed rank. The wrapper's summary is short and comes last."""
    import json  # noqa: PLC0415

    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure  # noqa: PLC0415

    from nvrx_eks.k8s.termination import failure_cause, log_tail  # noqa: PLC0415
    from nvrx_eks.training.resilience.launch import failure_summary  # noqa: PLC0415

    error_file = tmp_path / "error.json"
    stack = "Traceback (most recent call last):\n" + '  File "x.py", line 1, in f\n' * 200
    error_file.write_text(
        json.dumps({"message": {"message": "RuntimeError: Connection reset by peer", "extraInfo": {
            "py_callstack": stack, "timestamp": "0"}}})
    )  # fmt: skip
    failures = {
        2: ProcessFailure(local_rank=0, pid=11, exitcode=1, error_file=str(error_file)),
        3: ProcessFailure(local_rank=1, pid=12, exitcode=-9, error_file=str(tmp_path / "none.json")),
    }
    # As ft_launcher logged it: the SIGKILLed rank first, the collateral one's call stack after it.
    logged = {3: failures[3], 2: failures[2]}
    nvrx_line = f"Some rank(s) exited with non-zero exit code: {logged}. Agent's exit code = 1"
    log = f"{nvrx_line}\nworker failures: {failure_summary(failures)}\n"
    assert len(log_tail(log)) <= 2048
    cause = failure_cause(log_tail(log))
    assert cause.text == "worker rank 3 exit code -9 (Signal 9 (SIGKILL))"
    assert "Connection reset" in failure_summary(failures)
    # Without the summary, the kubelet's tail holds only the collateral rank's call stack.
    assert "rank 3" not in failure_cause(log_tail(f"{nvrx_line}\n")).text


# ft_launcher's real main, with its agent replaced by one whose workers failed with these exit codes.
_FAILED_AGENT = """
import sys
from nvidia_resiliency_ext.fault_tolerance import launcher
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from nvrx_eks.training.resilience.launch import main

CODES = [int(code) for code in sys.argv[1].split(",")]

def launch_agent(config, entrypoint, args):
    failures = {
        rank: ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file="/nonexistent")
        for rank, code in enumerate(CODES)
    }
    raise ChildFailedError(name="training", failures=failures)

launcher.launch_agent = launch_agent
sys.argv = ["nvrx_eks.training.resilience.launch", "--nnodes=1", "--nproc-per-node=2", "--start-method=spawn",
            "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:1", "--rdzv-id=test",
            "--", "-m", "nvrx_eks.training"]
main()
"""


@pytest.mark.parametrize(
    ("exit_codes", "collateral"),
    [
        pytest.param("-15,-15", True, id="every-rank-stopped-by-its-launcher"),
        pytest.param("143", True, id="stopped-through-a-shell"),
        pytest.param("-15,-9", False, id="a-rank-killed-here"),
        pytest.param("-15,1", False, id="a-rank-failed-here"),
    ],
)
def test_a_launcher_whose_ranks_were_only_stopped_exits_with_the_collateral_code(exit_codes, collateral):
    """The Job's podFailurePolicy does not charge the collateral exit (k8s/job_chart.py); a pod where a
    rank failed by itself keeps ft_launcher's 1 and is charged."""
    from nvrx_eks.training.resilience.launch import COLLATERAL_EXIT_CODE  # noqa: PLC0415

    run = subprocess.run(
        [sys.executable, "-c", _FAILED_AGENT, exit_codes],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one log, as the pod's
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == (COLLATERAL_EXIT_CODE if collateral else 1), run.stdout[-2000:]
    # The failed ranks are still the last line (the pod's termination message names them).
    assert run.stdout.strip().splitlines()[-1].startswith("worker failures: {0: ProcessFailure("), run.stdout


_FORKED_IMPORTS = r"""
import json, multiprocessing, sys
import nvrx_eks.training.events
def child(queue):
    import xmlrpc.client  # a package nothing here imported before the fork
    queue.put(nvrx_eks.training.events.imported_since_fork())

if __name__ == "__main__":
    queue = multiprocessing.get_context("fork").SimpleQueue()
    process = multiprocessing.get_context("fork").Process(target=child, args=(queue,))
    process.start()
    forked = queue.get()
    process.join()
    print(json.dumps({"forked": forked, "parent": nvrx_eks.training.events.imported_since_fork()}))
"""


def test_a_forked_process_names_the_modules_it_imported_itself_and_a_fresh_one_says_it_was_not_forked():
    done = run_python("-c", _FORKED_IMPORTS, timeout=120, cwd=REPO, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert "xmlrpc" in seen["forked"]
    assert "xmlrpc.client" not in seen["forked"]  # each package once, by its outermost new module
    assert seen["parent"] is None


@pytest.mark.parametrize(
    ("durable_dir", "s3"), [("s3://bucket/run", True), ("/fsx/durable/run", False), (None, False)]
)
def test_any_script_with_an_s3_durable_tier_gets_the_sdk_warm(durable_dir, s3, monkeypatch):
    """The durable tier is read from the job's configuration (the ranks' NVRX_EKS_CONFIG), whatever the
    script: never from a script's flags."""
    monkeypatch.delenv("NVRX_EKS_PRELOAD", raising=False)
    config = ResilienceConfig.model_validate({"checkpoint": {"durable_dir": durable_dir}})
    assert warm_modules(config) == [*WARM_MODULES, *(S3_MODULES if s3 else ())]
    monkeypatch.setenv("NVRX_EKS_PRELOAD", "transformers, examples.hf_llama.train")
    assert warm_modules(config)[-2:] == ["transformers", "examples.hf_llama.train"]


def test_the_forkserver_imports_start_no_thread():
    # A fork copies only the calling thread; a thread another import started would be missing, with
    # whatever lock it held, in every worker.
    script = "import sys, threading\nfor n in sys.argv[1].split(','): __import__(n)\n"
    script += "print(threading.active_count())"
    done = run_python("-c", script, ",".join((*WARM_MODULES, *S3_MODULES)), timeout=120, cwd=REPO, check=True)
    assert done.stdout.strip().splitlines()[-1] == "1"


# ----- the entry point: checked before any rank, its imports made once per pod --------------------------

LAUNCH = (sys.executable, "-m", "nvrx_eks.training.resilience.launch")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return run_python("-c", code, timeout=120, check=True)


def test_the_launcher_refuses_an_entry_point_that_is_not_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"entrypoint\.module no_such_package\.train: .*fix the module name"):
        check_entry(launcher_argv(["--nnodes=1", "--", "-m", "no_such_package.train", "--steps", "3"]))
    with pytest.raises(UserError, match=r"entrypoint\.script missing\.py: no such file"):
        check_entry(launcher_argv(["--nnodes=1", "--", "missing.py"]))
    check_entry(
        launcher_argv(["--nnodes=1", "--", "-m", "nvrx_eks.training", "--steps", "3"])
    )  # the trainer's own


def test_the_launcher_finds_a_module_without_running_its_packages(tmp_path, monkeypatch):
    """A package that imports torch at its top would cost the launcher seconds at every pod start; one
    that raises shows the check never ran it. Found all the same, as the worker will find it."""
    package = tmp_path / "mytrain"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (package / "main.py").write_text("print('training')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    check_entry(launcher_argv(["--nnodes=1", "--", "-m", "mytrain.main"]))
    assert "mytrain" not in sys.modules
    assert entry_source("module", "mytrain.main") == package / "main.py"


def test_a_relative_script_is_found_on_the_python_path_as_the_image_finds_it(tmp_path, monkeypatch):
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "train.py").write_text("print('training')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "project"))
    check_entry(launcher_argv(["--nnodes=1", "--", "train.py"]))
    assert entry_source("script", "train.py") == tmp_path / "project" / "train.py"


def test_a_launcher_with_no_such_module_exits_2_with_one_line_before_any_rank(tmp_path):
    """Not 13-31 s later, after the rendezvous, with torch's "To enable traceback" as the job's reason."""
    done = subprocess.run(
        [*LAUNCH, "--standalone", "--nproc-per-node=1", "--", "-m", "no_such_package.train", "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == USER_ERROR_EXIT_CODE, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: entrypoint.module no_such_package.train: ModuleNotFoundError"), last
    assert "Traceback" not in done.stderr
    assert "starting workers" not in done.stdout + done.stderr  # ft_launcher's line before any rank


_PROJECT_SCRIPT = """
from __future__ import annotations

import json
from collections import OrderedDict as Ordered

try:
    import helper
except ImportError:
    helper = None

if False:
    import not_at_the_top
from . import relative  # a script has no package: never made

def main():
    import inside_a_function
"""


def test_the_warm_module_makes_the_entry_points_top_level_imports_only(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(_PROJECT_SCRIPT)
    # A helper beside the script whose name a module elsewhere on the path also has: the script's own.
    (project / "helper.py").write_text("MARK = 'beside the script'\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "helper.py").write_text("MARK = 'elsewhere'\n")
    folder, name = write_warm_module(project / "train.py", script_folder=project)
    probe = (
        "import sys, json\n"
        f"sys.path[:0] = [{str(tmp_path / 'elsewhere')!r}]\n"
        f"sys.path.append({str(folder)!r})\n"
        f"__import__({name!r})\n"
        "print(json.dumps([sys.modules['helper'].MARK, 'collections' in sys.modules,"
        " 'not_at_the_top' in sys.modules, 'inside_a_function' in sys.modules,"
        f" {str(project)!r} in sys.path]))\n"
    )
    done = run_python("-c", probe, timeout=60, check=True)
    helper_mark, ordered, nested, inside, folder_left = json.loads(done.stdout.splitlines()[-1])
    assert helper_mark == "beside the script"
    assert (ordered, nested, inside, folder_left) == (True, False, False, False)


def test_the_warm_module_imports_a_name_a_package_loads_lazily(tmp_path):
    """`from transformers import LlamaForCausalLM` loads the model's code only when the name is taken:
    importing the bare module (all `entrypoint.preload` can name) leaves it for every restarted rank."""
    script = tmp_path / "train.py"
    script.write_text("from transformers import LlamaForCausalLM\n")
    folder, name = write_warm_module(script, script_folder=tmp_path)
    probe = f"import sys\nsys.path.append({str(folder)!r})\n__import__({name!r})\n"
    probe += "print('transformers.models.llama.modeling_llama' in sys.modules)"
    done = run_python("-c", probe, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "True"


def test_the_entry_points_imports_can_be_left_to_the_ranks(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("import json\n")
    ft_argv = launcher_argv(["--nnodes=1", "--", str(tmp_path / "train.py")])
    warm = warm_entry_imports(ft_argv)
    assert warm is not None
    assert (warm[0] / f"{warm[1]}.py").is_file()
    monkeypatch.setenv(PRELOAD_IMPORTS_ENV, "0")  # entrypoint.preload_imports: false
    assert warm_entry_imports(ft_argv) is None
    assert warm_entry_imports(launcher_argv(["--nnodes=1", "--", "-m", "nvrx_eks.training"])) is None


_FORKSERVER_PROBE = """
import json, multiprocessing, sys
from nvrx_eks.training.resilience import launch

launch.WARM_MODULES = ()  # the kit's own warm modules are another test's: only the entry point's here
from nvrx_eks.training.resilience.config import ResilienceConfig
config = ResilienceConfig()
launch.start_forkserver(launch.launcher_argv(["--nnodes=1", "--", sys.argv[1]]), launch.warm_modules(config))
import probe

queue = multiprocessing.get_context("forkserver").SimpleQueue()
worker = multiprocessing.get_context("forkserver").Process(target=probe.report, args=(queue,))
worker.start()
worker.join(60)
print(json.dumps(queue.get()))
"""


def test_a_worker_forked_from_the_forkserver_has_the_scripts_imports_made(tmp_path):
    """Through a real forkserver (a fresh `python -c` that finds modules on PYTHONPATH, not on the
    launcher's sys.path): the worker finds the script's imports already made, the helper beside it too."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("import colorsys\nimport helper\n")
    (project / "helper.py").write_text("MARK = 'beside the script'\n")
    (tmp_path / "probe.py").write_text(
        "import sys\n\n\ndef report(queue):\n"
        "    queue.put([name in sys.modules for name in ('colorsys', 'helper')])\n"
    )
    done = run_python(
        "-c",
        _FORKSERVER_PROBE,
        str(project / "train.py"),
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, True]


_CLOSED_STORE = """
import sys, time
from datetime import timedelta
from torch.distributed import TCPStore
from nvrx_eks.training.resilience.nvrx_compat import barrier_state

port, grace = int(sys.argv[1]), float(sys.argv[2])
store = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False)
barrier_state(store, run_id="job").set_shutdown()  # every launcher ended: NVRx closed the rendezvous
print("closed", flush=True)
time.sleep(grace)  # the control process's grace before it exits
"""


@contextlib.contextmanager
def closed_store(port: int, *, grace_s: float) -> Iterator[subprocess.Popen[str]]:
    """A store whose rendezvous `job` NVRx closed for good, alive for `grace_s` more seconds."""
    with subprocess.Popen(
        [sys.executable, "-c", _CLOSED_STORE, str(port), str(grace_s)], stdout=subprocess.PIPE, text=True
    ) as old:
        try:
            assert old.stdout is not None
            assert old.stdout.readline().strip() == "closed"
            yield old
        finally:
            old.kill()


def test_a_new_launcher_waits_past_a_rendezvous_closed_for_good_for_the_restarted_store(capsys, reserve_port):
    """A replacement pod that reaches the store in the seconds between NVRx's permanent close and the
    control process's exit joins the restarted store's fresh rendezvous, not the closed one."""
    from datetime import timedelta  # noqa: PLC0415

    from torch.distributed import TCPStore  # noqa: PLC0415

    from nvrx_eks.training.resilience.launch import open_rendezvous_store  # noqa: PLC0415
    from nvrx_eks.training.resilience.nvrx_compat import barrier_state  # noqa: PLC0415

    port = reserve_port()  # held: the store's restart binds it again
    restarted: list[TCPStore] = []
    with closed_store(port, grace_s=3) as old:

        def restart() -> None:  # the Deployment's restart of the store's container, once it exited
            old.wait(timeout=30)
            store = TCPStore(
                "127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
            )
            restarted.append(store)

        restarter = threading.Thread(target=restart)
        restarter.start()
        store = open_rendezvous_store(f"127.0.0.1:{port}", run_id="job", wait_s=60)
        restarter.join(timeout=30)
        assert old.returncode == 0
    assert restarted
    assert not barrier_state(store, run_id="job").is_shutdown()
    assert "rendezvous job at 127.0.0.1:" in capsys.readouterr().out


def test_a_new_launcher_gives_up_waiting_at_its_join_timeout_and_joins_as_before(reserve_port):
    from nvrx_eks.training.resilience.launch import open_rendezvous_store  # noqa: PLC0415
    from nvrx_eks.training.resilience.nvrx_compat import barrier_state  # noqa: PLC0415

    port = reserve_port()
    with closed_store(port, grace_s=30):
        started = time.monotonic()
        store = open_rendezvous_store(f"127.0.0.1:{port}", run_id="job", wait_s=1.5)
        assert 1.5 <= time.monotonic() - started < 10
        assert barrier_state(store, run_id="job").is_shutdown()  # NVRx's join then fails, as before


_FORKED_FORKSERVER = r"""
import json, multiprocessing, os, sys
from pathlib import Path
import torch
from nvrx_eks.training.resilience.launch import fork_forkserver

def exit_with_threads():
    os._exit(10 + torch.get_num_threads())

held = open(sys.argv[1], "w")  # a descriptor of the launcher's, which the forkserver must not keep
os.environ["OMP_NUM_THREADS"] = "1"  # set after torch's import, as a warm runtime's fork gets the pod's
multiprocessing.set_forkserver_preload(["json"])
fork_forkserver(["json"])
server = multiprocessing.forkserver._forkserver._forkserver_pid
worker = multiprocessing.get_context("forkserver").Process(target=exit_with_threads)
worker.start()
worker.join(timeout=30)
fds = [os.readlink(f"/proc/{server}/fd/{fd}") for fd in os.listdir(f"/proc/{server}/fd")]
cmdline = Path(f"/proc/{server}/cmdline").read_bytes() == Path("/proc/self/cmdline").read_bytes()
print(json.dumps({"exitcode": worker.exitcode, "fds": fds,
                  "forked": cmdline, "children": os.waitpid(server, os.WNOHANG)[0] == 0}))
"""


def test_a_forkserver_forked_from_the_launcher_starts_workers_and_keeps_none_of_its_descriptors(tmp_path):
    """`fork_forkserver` (the warm runtime's launcher, `FORKSERVER_FORK_ENV`): the forkserver is this
    process's fork, not a fresh `python -c` importing torch again, and serves workers as multiprocessing's
    own; it keeps only the listener, the alive pipe and the standard streams of what the launcher had."""
    held = tmp_path / "held-by-the-launcher"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = run_python("-c", _FORKED_FORKSERVER, str(held), timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # torch's threads as OMP_NUM_THREADS says, though set after torch was imported (the warm server's)
    assert report["exitcode"] == 10 + 1
    assert report["forked"]  # the same command line: a fork of this process
    assert report["children"]  # alive, and this process's child
    assert str(held) not in report["fds"]
