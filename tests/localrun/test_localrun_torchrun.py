"""localrun/torchrun.py: plain torchrun whose workers are forks of one forkserver that imported the
script's imports, each given what torchrun gives a worker and running the script as `python SCRIPT`."""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
from pathlib import Path

import pytest
from children import run_python

from nvrx_eks.localrun.torchrun import standalone

_WORKER = """
import sys
torch_before_the_script = "torch" in sys.modules
import json, os
import torch
import helper
seen = {
    "name": __name__,
    "argv": sys.argv[1:],
    "torch_before_the_script": torch_before_the_script,
    "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")},
    "helper": helper.MARK,
}
with open(os.path.join(sys.argv[1], f"rank-{os.environ['RANK']}.json"), "w") as out:
    json.dump(seen, out)
if sys.argv[2] == "fail" and os.environ["RANK"] == "1":
    sys.exit(3)
"""


@pytest.mark.slow
@pytest.mark.shareable
@pytest.mark.parametrize("outcome", ["ok", "fail"])
def test_each_worker_runs_the_script_as_torchrun_would_with_torch_imported_before_it(tmp_path, outcome):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(textwrap.dedent(_WORKER))
    (project / "helper.py").write_text("MARK = 'beside the script'\n")
    argv = standalone(ranks=2, entry=[str(project / "train.py"), str(tmp_path), outcome])
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK"}}
    # A temporary folder of the run's own, short: the forkserver's socket is named in it, and a Unix
    # socket's path has room for 107 bytes (a pytest worker's tmp_path can be longer).
    with tempfile.TemporaryDirectory(prefix="torchrun-") as tmp:
        done = run_python(*argv[1:], timeout=120, cwd=tmp_path, env=env | {"TMPDIR": tmp})
        # The module of the script's imports written for the forkserver is gone (torchrun's logs stay).
        left = list(Path(tmp).glob("nvrx-eks-warm-*"))
    assert (done.returncode == 0) == (outcome == "ok"), done.stderr[-3000:]
    seen = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    for rank, worker in enumerate(seen):
        assert worker["name"] == "__main__"
        assert worker["argv"] == [str(tmp_path), outcome]
        assert worker["torch_before_the_script"]  # the forkserver's import, not the worker's
        assert worker["helper"] == "beside the script"  # the script's own folder first on its path
        assert worker["env"]["RANK"] == worker["env"]["LOCAL_RANK"] == str(rank)
        assert worker["env"]["WORLD_SIZE"] == "2"
    assert seen[0]["env"]["TORCHELASTIC_RUN_ID"] == seen[1]["env"]["TORCHELASTIC_RUN_ID"]
    assert not left, left
