"""A pytest plugin: each test's wall time and the machine's busy CPU time over it, one line per test.

The slow tests start local jobs whose processes are not the test's children for long (forks of a warm
server, daemonized monitors), so a process's own resource usage misses most of their CPU. The whole
machine's busy time (/proc/stat) does not, when nothing else runs: run the tests one at a time on an
otherwise idle machine, without xdist workers.

    PYTHONPATH=tools .venv/bin/python -m pytest -p cpu_per_test -m "slow and not shareable" -p no:xdist

The lines go to the file CPU_PER_TEST_OUT names (default cpu-per-test.tsv): wall seconds, busy
CPU-seconds, the test's id. docs/measurements.md has what they showed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator

_OUT = Path(os.environ.get("CPU_PER_TEST_OUT", "cpu-per-test.tsv"))
_TICKS = os.sysconf("SC_CLK_TCK")


def busy_seconds() -> float:
    """CPU-seconds every core of the machine has spent busy since boot: user, nice, system, irq and
    softirq time (proc(5)); idle and iowait are left out."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return (user + nice + system + irq + softirq) / _TICKS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:  # noqa: ARG001 - pytest's hook signature
    busy, started = busy_seconds(), time.monotonic()
    yield
    wall, cpu = time.monotonic() - started, busy_seconds() - busy
    with _OUT.open("a") as out:
        out.write(f"{wall:.1f}\t{cpu:.1f}\t{item.nodeid}\n")
