"""jsii (under aws-cdk-lib and cdk8s) runs on the Node LTS pinned in package.json: no banner."""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

import pytest
from children import run_python

from nvrx_eks.node import NODE_BIN, REPO, pinned_node_version

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="package.json pins Node as a Linux platform package only"
)

# What jsii prints on a Node past (or near) its end of life: "Node 20 is end-of-life and not
# supported anymore by this software since ...", "... has reached end-of-life" / "is deprecated".
BANNER = re.compile(r"end-of-life|deprecated|not supported anymore|!!!!", re.IGNORECASE)


def _user_env() -> dict[str, str]:
    """The environment after `source .venv/bin/activate`: the venv first, then the machine's PATH;
    nothing that silences jsii, no node_modules/.bin (only `make` and `npx` add it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JSII_")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != str(NODE_BIN)]
    env["PATH"] = os.pathsep.join([str(REPO / ".venv" / "bin"), *path])
    return env | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}


def test_package_json_pins_a_supported_node_lts() -> None:
    version = pinned_node_version()
    assert version is not None, "package.json pins no node-linux-* package for this machine"
    # Node 24 is Active/Maintenance LTS until 2028-04-30 (nodejs.org/en/about/previous-releases);
    # jsii 1.142 lists ^24.0.0 among its supported releases.
    assert int(version.split(".")[0]) >= 24, version
    assert (NODE_BIN / "node").exists(), "run `npm ci` (make setup): node_modules/.bin/node is missing"


def test_node_as_the_kit_resolves_it_is_the_pinned_major() -> None:
    probe = (
        "import shutil, subprocess; from nvrx_eks.node import use_pinned_node; use_pinned_node(); "
        "print(subprocess.run([shutil.which('node'), '--version'], capture_output=True, text=True,"
        " check=True).stdout.strip())"
    )
    out = run_python("-c", probe, timeout=30, cwd=REPO, env=_user_env(), check=True).stdout.strip()
    pinned = pinned_node_version()
    assert pinned is not None
    assert out == f"v{pinned}", (out, pinned)


@pytest.mark.slow
@pytest.mark.shareable
def test_job_render_prints_no_node_banner(tmp_path: Path) -> None:
    """`nvrx-eks job render` as a user runs it from the activated venv (no JSII_SILENCE_* set)."""
    result = run_python(
        "-c",
        "from nvrx_eks.cli import main; main()",
        "job",
        "render",
        "-f",
        "k8s/values/local-cpu.yaml",
        "-o",
        str(tmp_path),
        timeout=120,
        cwd=REPO,
        env=_user_env(),
    )
    assert result.returncode == 0, result.stderr
    assert not BANNER.search(result.stdout + result.stderr), result.stdout + result.stderr
    # Only the rendered file's name reaches the user.
    assert result.stdout.strip().splitlines() == [str(tmp_path / "nvrx-local.k8s.yaml")], result.stdout
    # On stderr only the kit's own memory budget line: nothing of a dependency.
    assert result.stderr.strip().splitlines() == [
        line for line in result.stderr.strip().splitlines() if line.startswith("host memory for checkpoints")
    ], result.stderr
