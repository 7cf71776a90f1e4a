"""`bench peer --mix hardware`: the faults its default seed draws, through the job values it renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvrx_eks.bench.peer import DEFAULT_SEEDS, mode_setups, parse_modes, run_peer_bench
from nvrx_eks.k8s.load import load_values
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.training.faults import build_schedule
from nvrx_eks.training.resilience.modes import MODES

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "k8s" / "values" / "local-cpu.yaml"


def _drawn(mix: str, steps: int = 400) -> list[tuple[str, int]]:
    (kit,) = (s for s in mode_setups(steps=steps, fault_seed=DEFAULT_SEEDS[mix], mix=mix) if s.mode == "both")
    values = load_values(LOCAL, [f"mode={kit.mode}", *kit.overrides])
    config = values.trainer  # the trainer's config as the rendered job passes it
    schedule = build_schedule(config.faults, steps=steps, world_size=values.world_size, seed=config.seed)
    ranks_per_node = values.profile.workers_per_node
    return [(f.cls, f.rank // ranks_per_node) for f in schedule]


def test_the_hardware_mix_draws_mostly_hardware_and_loses_each_node_once():
    drawn = _drawn("hardware")
    classes = [cls for cls, _ in drawn]
    assert len(drawn) == 5
    assert classes.count("node_loss") + classes.count("sigkill") == 4, drawn
    assert sorted(node for cls, node in drawn if cls == "node_loss") == [0, 1], drawn


def test_the_peer_mix_is_the_samples_software_faults():
    assert {cls for cls, _ in _drawn("peer")} <= {"exception", "hang"}


def test_an_unknown_mix_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(UserError, match="choose one of peer, hardware"):
        run_peer_bench(values_path=LOCAL, steps=40, runs_root=tmp_path, mix="software")
    assert not list(tmp_path.iterdir())


def test_every_arm_is_named_by_the_mode_it_runs_and_an_unknown_name_is_refused(tmp_path):
    """`--mode both` runs the kit's arm (the job values', the planner's and the docs' name for it); a
    name that is no mode is one message, never an empty table."""
    assert [setup.mode for setup in mode_setups(steps=40)] == list(MODES)
    assert parse_modes(["both", "baseline"]) == ("both", "baseline")
    for name in ("kit", "Both", "nvrx"):
        with pytest.raises(UserError, match=rf"--mode '{name}': choose one or more of baseline, inprocess"):
            parse_modes([name])


def test_the_cli_refuses_an_unknown_mode_with_exit_2(nvrx_eks, tmp_path):
    proc = nvrx_eks("bench", "peer", "--mode", "kit", "--runs", str(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--mode 'kit': choose one or more of baseline, inprocess, ft_launcher, both" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())
