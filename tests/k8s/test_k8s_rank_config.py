"""The job values' `trainer` section is the trainer's own typed configuration, validated once.

What the values hold is what the ranks run with: the chart's fields are set in it, the rendered flags
and a script's `NVRX_EKS_CONFIG` parse back to it, and every problem in it is reported at once with the
field's full path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvrx_eks.k8s.load import load_values
from nvrx_eks.k8s.rank_config import resilience_env
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.training.config import TrainConfig, parse_args, to_args
from nvrx_eks.training.faults import build_schedule
from nvrx_eks.training.resilience.config import CONFIG_ENV, FaultsConfig, ResilienceConfig, resilience_config

ROOT = Path(__file__).resolve().parents[2]
VALUES = sorted((ROOT / "k8s" / "values").glob("*.yaml"))
LOCAL = ROOT / "k8s" / "values" / "local-cpu.yaml"
SCRIPT = ROOT / "k8s" / "values" / "local-hf-llama.yaml"


@pytest.mark.parametrize("path", VALUES, ids=lambda p: p.name)
def test_what_the_ranks_parse_is_what_the_values_hold(path):
    values = load_values(path)
    if values.entrypoint is None:
        assert isinstance(values.trainer, TrainConfig)
        assert parse_args(to_args(values.trainer)) == values.trainer
    else:
        assert type(values.trainer) is ResilienceConfig
        document = json.loads(resilience_env(values.entrypoint, values.trainer)[CONFIG_ENV])
        assert resilience_config(document, source="NVRX_EKS_CONFIG") == values.trainer


def test_the_chart_owned_fields_are_set_from_the_rest_of_the_values():
    values = load_values(LOCAL, ["mode=inprocess", "budgets.inprocess_max_iterations=4"])
    config, storage = values.trainer, values.storage
    assert config.mode == "inprocess"
    assert str(config.run_dir) == f"{storage.fsx_mount_path}/runs/{values.name}"
    assert str(config.checkpoint.memory_dir) == storage.memory_mount_path
    assert config.checkpoint.durable_dir == f"{storage.fsx_mount_path}/durable/{values.name}"
    assert str(config.checkpoint.local_dir) == f"{storage.local_mount_path}/checkpoints/{values.name}"
    assert config.inprocess.max_iterations == 4


@pytest.mark.parametrize(
    ("overrides", "replicas"),
    [
        ([], 1),  # more than one node, memory snapshots: one copy on a partner
        (["num_nodes=1", "spares=0"], 0),
        (["trainer.checkpoint.implementation=sync"], 0),
        (["trainer.checkpoint.memory_every=0", "trainer.checkpoint.local_every=0"], 0),
        (["storage.peer_replicas=0"], 0),
    ],
)
def test_the_default_peer_replica_follows_the_checkpointer(overrides, replicas):
    values = load_values(LOCAL, ["trainer.checkpoint.durable_every=0", *overrides])
    assert values.peer_replicas == values.trainer.checkpoint.peer_replicas == replicas


def test_every_problem_of_the_section_is_one_message_with_full_paths():
    with pytest.raises(UserError) as info:
        load_values(
            LOCAL,
            [
                "trainer.steps=0",
                "trainer.checkpoint.memory_every=-1",
                "trainer.inprocess.soft_timeout_s=oops",
                "spares=-1",
            ],
        )
    message = str(info.value)
    assert "4 invalid value(s)" in message
    for field in (
        "trainer.steps",
        "trainer.checkpoint.memory_every",
        "trainer.inprocess.soft_timeout_s",
        "spares",
    ):
        assert f"  - {field}: " in message


@pytest.mark.parametrize(
    ("override", "owner"),
    [
        ("trainer.checkpoint.peer_replicas=1", "storage.peer_replicas"),
        ("trainer.inprocess.max_iterations=2", "budgets.inprocess_max_iterations"),
        ("trainer.mode=baseline", "mode"),
    ],
)
def test_a_chart_owned_field_names_the_value_that_sets_it(override, owner):
    with pytest.raises(
        UserError, match=r"set by the chart \(from " + owner.replace(".", r"\.").replace(")", r"\)")
    ):
        load_values(LOCAL, [override])


def test_a_script_section_holds_only_the_kits_fields():
    with pytest.raises(UserError, match=r"trainer\.steps: .*your script's own settings go in entrypoint"):
        load_values(SCRIPT, ["trainer.steps=10"])


def test_a_too_small_slot_count_names_what_the_default_replica_needs():
    """The default replica counts in the staging slots the first message asks for."""
    with pytest.raises(UserError, match="set it to at least 5"):
        load_values(LOCAL, ["trainer.checkpoint.local_every=0", "trainer.checkpoint.num_staging_slots=1"])


def test_the_draw_does_not_depend_on_how_the_weights_were_written():
    def draw(weights: dict[str, float]) -> list[tuple[str, int, int]]:
        faults = FaultsConfig(count=6, weights=weights)
        return [(f.cls, f.step, f.rank) for f in build_schedule(faults, steps=60, world_size=4, seed=3)]

    assert draw({"sigkill": 0.5, "exception": 0.3, "hang": 0.2}) == draw(
        {"hang": 0.2, "exception": 0.3, "sigkill": 0.5}
    )
