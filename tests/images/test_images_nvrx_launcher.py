"""The job chart's launcher flags parse with the ft_launcher of the NVRx version the image pins.

`make setup` installs that very version here (tools/nvrx-wheel.sh), so the parse is the real one:
`parse_args` and `FaultToleranceConfig.from_args`, exactly what ft_launcher runs before it starts workers.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
from nvidia_resiliency_ext.fault_tolerance import launcher
from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig

from nvrx_eks.k8s.job_chart import node_address, store_endpoint
from nvrx_eks.k8s.launcher import FT_LAUNCHER, launcher_command
from nvrx_eks.k8s.load import load_values
from nvrx_eks.kitcore.pins import IMAGE
from nvrx_eks.training.resilience.launch import ENTRY_SEPARATOR, entry_script, launcher_argv

REPO = Path(__file__).resolve().parents[2]
VALUES = REPO / "k8s" / "values" / "p5-2.yaml"
MODES = ("both", "ft_launcher", "inprocess")
# Spellings of releases before the pin: each must be refused, proving the parse can fail.
REMOVED_IN_PIN = (["--ignore-missing-fault-tol-cfg"], ["--ft-restart-policy=min-healthy"])


def test_the_installed_nvrx_is_the_images_pin():
    assert metadata.version("nvidia-resiliency-ext") == IMAGE.nvrx_version


def _chart_command(mode: str) -> list[str]:
    values = load_values(VALUES, [f"mode={mode}"])
    assert values.resolved_nvrx_version == IMAGE.nvrx_version  # an image job: flags from the pin
    return launcher_command(
        values,
        store_endpoint=store_endpoint(values),
        node_address=node_address(values),
        entry=values.entrypoint.command(),
    )


@pytest.mark.parametrize("mode", MODES)
def test_chart_launcher_flags_parse_with_the_pinned_ft_launcher(mode):
    command = _chart_command(mode)
    assert command[: len(FT_LAUNCHER)] == list(FT_LAUNCHER)
    # What ft_launcher receives: training/resilience/launch.py's rewrite of the rendered command's arguments.
    args = launcher.parse_args(launcher_argv(command[len(FT_LAUNCHER) :]))
    cfg = FaultToleranceConfig.from_args(args)
    # The workers fork from the warm forkserver and run the entry point, the reference trainer's module
    # (training/resilience/launch.py).
    assert args.module is False
    assert args.run_path is True
    assert args.start_method == "forkserver"
    assert args.training_script == entry_script()
    assert args.nnodes == "2:2"
    assert args.nproc_per_node == "8"
    assert cfg.rank_heartbeat_timeout == 300
    assert cfg.initial_rank_heartbeat_timeout == 1200
    assert args.ft_restart_policy == "any-failed"
    # The trainer's own arguments arrive untouched after `-m nvrx_eks.training`.
    at = command.index(ENTRY_SEPARATOR)
    assert command[at + 1 : at + 3] == ["-m", "nvrx_eks.training"]
    assert args.training_script_args == ["--module", "nvrx_eks.training", *command[at + 3 :]]


@pytest.mark.parametrize("extra", REMOVED_IN_PIN, ids=lambda e: e[0])
def test_the_pinned_parser_really_rejects_flags_it_lacks(extra, capsys):
    base = _chart_command("ft_launcher")
    at = base.index(ENTRY_SEPARATOR)  # where the launcher's flags end
    with pytest.raises(SystemExit) as info:
        launcher.parse_args(launcher_argv([*base[len(FT_LAUNCHER) : at], *extra, *base[at:]]))
    assert info.value.code == 2
    assert extra[0].split("=")[0] in capsys.readouterr().err
