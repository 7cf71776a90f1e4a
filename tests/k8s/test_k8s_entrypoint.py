"""A training script of your own in the Job (`entrypoint`): what the chart renders for it, and the values
it refuses before anything is rendered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser

from nvrx_eks.k8s.job_chart import render
from nvrx_eks.k8s.launcher import FT_LAUNCHER
from nvrx_eks.k8s.load import load_values
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.training import api
from nvrx_eks.training.node import selfcheck
from nvrx_eks.training.resilience.config import CONFIG_ENV
from nvrx_eks.training.resilience.launch import PRELOAD_ENV, entry_script, launcher_argv

ROOT = Path(__file__).resolve().parents[2]
HF_VALUES = ROOT / "k8s" / "values" / "local-hf-llama.yaml"


def _trainer_container(tmp_path: Path, *overrides: str) -> dict:
    files = render(load_values(HF_VALUES, list(overrides)), str(tmp_path))
    docs = [doc for f in files for doc in yaml.safe_load_all(Path(f).read_text()) if doc]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def test_the_launcher_runs_the_scripts_module_with_its_own_args_in_a_warm_worker(tmp_path):
    container = _trainer_container(tmp_path)
    command = container["command"]
    assert command[: len(FT_LAUNCHER)] == list(FT_LAUNCHER)
    assert command[-4:] == ["-m", "examples.hf_llama.train", "--steps", "80"]
    ft_argv = launcher_argv(command[len(FT_LAUNCHER) :])
    parsed = get_args_parser().parse_args(ft_argv)  # the pinned ft_launcher's own parser
    assert parsed.run_path
    assert parsed.training_script == entry_script()
    assert parsed.training_script_args == ["--module", "examples.hf_llama.train", "--steps", "80"]


def test_the_script_gets_the_kits_settings_as_one_json_variable_the_api_reads(tmp_path):
    env = {e["name"]: e.get("value") for e in _trainer_container(tmp_path)["env"]}
    config = api.load_config({CONFIG_ENV: env[CONFIG_ENV]})
    # The chart's own fields and the values' trainer tree, merged: what the reference trainer reads too.
    assert config.mode == "both"
    assert str(config.run_dir) == "/fsx/runs/nvrx-hf-llama"
    assert str(config.checkpoint.memory_dir) == "/checkpoint-memory"
    assert config.checkpoint.peer_replicas == 1
    assert (
        config.checkpoint.memory_every,
        config.inprocess.soft_timeout_s,
        config.inprocess.max_iterations,
    ) == (
        2,
        2.5,
        6,
    )
    assert env[PRELOAD_ENV] == "transformers,examples.hf_llama.train"
    assert json.loads(env[CONFIG_ENV])["mode"] == "both"


def test_the_selfcheck_proves_the_checkpointer_the_scripts_ranks_read_from_their_env(tmp_path):
    files = render(load_values(HF_VALUES), str(tmp_path))
    docs = [doc for f in files for doc in yaml.safe_load_all(Path(f).read_text()) if doc]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    check = next(c for c in pod["initContainers"] if c["name"] == "selfcheck")
    # No --config: the script's ranks read theirs from the env; --store: where node problems are compared.
    assert check["command"] == [
        "python",
        "-m",
        "nvrx_eks.training.node.selfcheck",
        "--store=nvrx-hf-llama-rdzv:29400",
    ]
    env = {e["name"]: e.get("value") for e in check["env"]}
    ranks = api.load_config(env).effective_checkpoint()
    assert selfcheck.checkpoint_config(selfcheck.parse_args([], env), env) == ranks
    assert ranks.peer_replicas == 1


def test_a_script_path_is_run_as_python_would(tmp_path):
    command = _trainer_container(
        tmp_path, "entrypoint.module=null", "entrypoint.script=/workspace/train.py", "entrypoint.preload=[]"
    )["command"]
    assert command[-3:] == ["/workspace/train.py", "--steps", "80"]
    ft_argv = launcher_argv(command[len(FT_LAUNCHER) :])
    assert ft_argv[-6:] == ["--run-path", entry_script(), "--script", "/workspace/train.py", "--steps", "80"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["entrypoint.script=/workspace/train.py"], "- entrypoint: give one of module"),
        (["entrypoint.module=my-train"], "- entrypoint.module: 'my-train' is not a module name"),
        (["entrypoint.preload=[transformers, 'not a module']"], "'not a module': not module names"),
        (
            ["entrypoint.state_gib_per_rank=0"],
            "entrypoint.state_gib_per_rank: Input should be greater than 0",
        ),
        # The reference trainer's fields are not the kit's: a script's own are its args.
        (["trainer.model=tiny"], "1 invalid value(s)\n  - trainer.model: not one of the kit's fields"),
        (["trainer.checkpoint.memory_every=-1"], "checkpoint.memory_every"),
        (["trainer.faults.plan=exception@8:9"], "targets rank 9, but the job has ranks 0..3"),
    ],
)
def test_bad_entrypoint_values_are_one_message_naming_the_field(overrides, message):
    with pytest.raises(UserError) as error:
        load_values(HF_VALUES, overrides)
    assert message in str(error.value)


def test_values_without_an_entrypoint_run_the_reference_trainer_as_any_script(tmp_path):
    """The chart's default entry point is the reference trainer, given the same transport as a script:
    its module and own args on the command line, the kit's section in NVRX_EKS_CONFIG."""
    values = load_values(ROOT / "k8s" / "values" / "local-cpu.yaml", ["entrypoint=null"])
    assert values.entrypoint.command() == ["-m", "nvrx_eks.training"]
    files = render(values, str(tmp_path))
    docs = [doc for f in files for doc in yaml.safe_load_all(Path(f).read_text()) if doc]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][-3:] == ["--", "-m", "nvrx_eks.training"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert api.load_config(env) == values.trainer


@pytest.mark.parametrize(
    ("path", "hint", "fits"),
    [
        ("local-hf-llama.yaml", None, True),  # no hint: the ranks report their state, nothing to check
        ("local-hf-llama.yaml", 0.05, True),
        ("local-hf-llama.yaml", 2.0, False),
        ("local-cpu.yaml", 2.0, False),  # the reference trainer gets the same check, from the same hint
    ],
)
def test_every_script_gets_the_memory_tier_budget_check_from_its_state_hint(path, hint, fits):
    overrides = [f"entrypoint.state_gib_per_rank={hint}"] if hint is not None else []
    if fits:
        values = load_values(ROOT / "k8s" / "values" / path, overrides)
        assert (values.memory_budget is None) == (hint is None)
        return
    with pytest.raises(UserError, match=r"storage\.memory_tier_gib: the node's checkpoints in RAM need"):
        load_values(ROOT / "k8s" / "values" / path, overrides)
