"""`.ci/run`, which CI runs on a clean clone: it parses, and it ends in the README's test command."""

from __future__ import annotations

import subprocess
from pathlib import Path

CI_RUN = Path(__file__).resolve().parents[1] / ".ci" / "run"


def test_the_ci_script_parses_and_ends_in_make_test():
    # A stray backtick in a comment line once opened a command substitution that never closed: every
    # line before it ran, and CI failed at the end with a syntax error.
    argv = ["bash", "-n", str(CI_RUN)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in CI_RUN.read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert commands[:2] == ["set -euo pipefail", 'cd "$(dirname "$0")/.."'], commands[:2]
    assert commands[-1] == "make test"
    # The local nodes' addresses named before the suite's local runs (localrun/addresses.py).
    assert commands.index("python3 localrun/addresses.py --add") < len(commands) - 1
