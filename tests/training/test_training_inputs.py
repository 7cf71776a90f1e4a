"""The trainer's runtime input (files, folders, launcher variables): one message, exit 2, promptly.

Real processes, each bounded: a rank that hangs fails the test at its timeout and is killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from children import WarmChild, start_python

REPO = Path(__file__).resolve().parents[2]
# Generous for a loaded 2-core machine (torch import ~2-5 s); a hang runs into it.
PROMPT_S = 60


def _env(kit: dict[str, object] | None = None, **extra: str) -> dict[str, str]:
    """The rank's environment; `kit`: its kit section, as the chart hands it to any script."""
    env = {
        k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"}
    }
    config = {"NVRX_EKS_CONFIG": json.dumps(kit)} if kit is not None else {}
    return env | {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **config, **extra}


def _start(args: list[str], env: dict[str, str]) -> WarmChild | subprocess.Popen[str]:
    # In a session of its own: the rank's own children (checkpoint workers) go with it on a kill.
    return start_python(*args, cwd=REPO, env=env, merge_stderr=True)


def _finish(proc: WarmChild | subprocess.Popen[str]) -> tuple[int | None, str]:
    """(exit code, output); None as the code when the process was still running at PROMPT_S."""
    try:
        out, _ = proc.communicate(timeout=PROMPT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out


def test_a_missing_token_file_ends_every_rank_with_exit_2(tmp_path, reserve_port):
    port = str(reserve_port())
    missing = tmp_path / "tokens.bin"
    args = ["-m", "nvrx_eks.training", "--steps", "5", "--data-token-file", str(missing)]
    kit = {"mode": "both", "run_dir": str(tmp_path / "run")}
    ranks = [
        _start(
            args,
            _env(
                kit, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port
            ),
        )
        for r in range(2)
    ]
    results = [_finish(p) for p in ranks]
    for code, out in results:
        assert code == 2, out[-3000:]
        assert f"data.token_file {missing}: no such file" in out
        assert "Traceback" not in out


@pytest.mark.parametrize(
    ("setup", "env", "message"),
    [
        ("run_dir_file", {}, "is a file; pass a folder for the run's events"),
        ("run_dir_below_file", {}, "which is a file"),
        ("short_tokens", {}, "needs more than"),
        ("odd_tokens", {}, "is not a whole number of uint16 tokens"),
        ("token_folder", {}, "not a regular file"),
        ("ok", {"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is out of range (1..65535)"),
        ("ok", {"MASTER_PORT": "http"}, "MASTER_PORT='http' is not an integer"),
        ("ok", {"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
        ("prometheus", {"LOCAL_RANK": "1"}, "metrics.prometheus_port (65535) + LOCAL_RANK (1) is past port"),
    ],
)
def test_bad_runtime_input_is_one_message_and_exit_2(setup, env, message, tmp_path):
    run_dir = tmp_path / "run"
    args = ["-m", "nvrx_eks.training", "--steps", "3"]
    kit: dict[str, object] = {}
    if setup == "run_dir_file":
        run_dir.write_text("")
    elif setup == "run_dir_below_file":
        (tmp_path / "file").write_text("")
        run_dir = tmp_path / "file" / "run"
    elif setup in {"short_tokens", "odd_tokens", "token_folder"}:
        tokens = tmp_path / "tokens.bin"
        if setup == "token_folder":
            tokens.mkdir()
        else:
            tokens.write_bytes(b"\0" * (8 if setup == "short_tokens" else 9))
        args += ["--data-token-file", str(tokens)]
    elif setup == "prometheus":
        kit["metrics"] = {"prometheus_port": 65535}
    code, out = _finish(_start(args, _env({**kit, "run_dir": str(run_dir)}, **env)))
    assert code == 2, out[-3000:]
    assert message in out
    assert "Traceback" not in out


def test_a_port_past_65535_is_a_field_error():
    code, out = _finish(_start(["-m", "nvrx_eks.training"], _env({"metrics": {"prometheus_port": 70000}})))
    assert code == 2, out[-3000:]
    assert "NVRX_EKS_CONFIG: 1 invalid value(s)" in out
    assert "metrics.prometheus_port: Input should be less than or equal to 65535" in out


def test_a_failure_after_the_checkpoint_workers_started_still_exits(tmp_path):
    """Whatever fails between starting the persistent checkpoint workers and the loop, the rank exits:
    run() closes what it built (NVRx's own teardown at interpreter exit joined a dead worker forever)."""
    script = textwrap.dedent(
        """
        import sys
        import nvrx_eks.training.process
        class Boom(RuntimeError):
            pass
        def fail(*args, **kwargs):
            raise Boom("the trainer could not be built")
        nvrx_eks.training.process.Context = fail
        from nvrx_eks.training.__main__ import main
        sys.argv = ["training", "--steps", "3"]
        main()
        """
    )
    code, out = _finish(_start(["-c", script], _env({"run_dir": str(tmp_path / "run")})))
    assert code is not None, f"the rank did not exit within {PROMPT_S} s:\n{out[-3000:]}"
    assert code == 1
    assert "Boom: the trainer could not be built" in out
