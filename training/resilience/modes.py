"""The resilience modes, what each one runs, and which layer recovers which fault class in each.

One home for the meaning of a mode's name: the job values, the chart, the trainer, the planner and the
benchmarks ask `layers(mode)` what a mode runs, and `recovering_layer` who brings a fault back, never
by listing the names that do (tests/test_one_home.py). Torch-free: the charts and the planner read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Mode = Literal["baseline", "inprocess", "ft_launcher", "both"]
"""The resilience layers around the loop, one name from the job values through the trainer to the planner."""
MODES: tuple[Mode, ...] = get_args(Mode)

Launcher = Literal["torchrun", "ft_launcher"]


@dataclass(frozen=True)
class ModeLayers:
    """What one mode runs."""

    inprocess: bool
    """NVRx's in-process Wrapper around the training function: a soft fault restarts it in the same
    processes, with the in-process restart budget and timeouts."""
    heartbeats: bool
    """The ranks beat to ft_launcher's rank monitors, which end a rank silent for the heartbeat timeout
    (a deadlock below Python)."""
    launcher: Launcher
    """What starts a node's workers and restarts them after a process dies: ft_launcher, or torchrun in
    the baseline."""


_LAYERS: dict[Mode, ModeLayers] = {
    "baseline": ModeLayers(inprocess=False, heartbeats=False, launcher="torchrun"),
    "inprocess": ModeLayers(inprocess=True, heartbeats=False, launcher="ft_launcher"),
    "ft_launcher": ModeLayers(inprocess=False, heartbeats=True, launcher="ft_launcher"),
    "both": ModeLayers(inprocess=True, heartbeats=True, launcher="ft_launcher"),
}


def layers(mode: Mode) -> ModeLayers:
    """What `mode` runs."""
    return _LAYERS[mode]


def parse_mode(name: str) -> Mode | None:
    """`name` (from a command line or a run's events) as a mode, or None when it names none: the caller
    refuses it or says it does not know."""
    return name if name in MODES else None


FaultClass = Literal[
    "exception", "hang", "skip_collective", "sigkill", "oom", "deadlock", "node_loss", "store_loss"
]
FAULT_CLASSES: tuple[FaultClass, ...] = get_args(FaultClass)
SOFT_FAULTS: frozenset[FaultClass] = frozenset({"exception", "hang", "skip_collective", "oom"})
"""Faults the process survives: the in-process layer restarts the training function where the mode
runs it; the launcher restarts the workers where it does not."""
NODE_FAULTS: frozenset[FaultClass] = frozenset({"node_loss", "store_loss"})
"""Faults that take a pod: the Job controller (or a warm spare) brings the job back."""
HARNESS_ONLY: frozenset[FaultClass] = frozenset({"store_loss"})
"""Classes only a harness can fire: the rendezvous store's pod is not a training pod's to delete."""

RecoveringLayer = Literal["inprocess", "torchrun", "ft_launcher", "job_controller"]


def recovering_layer(cls: str, mode: Mode) -> RecoveringLayer:
    """The layer that must bring the job back from a fault of class `cls` in `mode`: a fault that ends a
    process is its launcher's (with or without heartbeats), one that takes a pod the Job controller's."""
    if cls in NODE_FAULTS:
        return "job_controller"
    spec = layers(mode)
    if cls in SOFT_FAULTS and spec.inprocess:
        return "inprocess"
    return spec.launcher
