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
    # The chart's own fields and the values' trainer tree, merged: what the reference trainer's flags say.
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
    assert check["command"] == ["python", "-m", "nvrx_eks.training.node.selfcheck"]
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
        (["entrypoint.script=/workspace/train.py"], "- entrypoint: give exactly one of module"),
        (["entrypoint.module=my-train"], "- entrypoint.module: 'my-train' is not a module name"),
        (
            ["entrypoint.module=nvrx_eks.training"],
            "nvrx_eks.training is the reference trainer: remove entrypoint",
        ),
        (["entrypoint.preload=[transformers, 'not a module']"], "'not a module': not module names"),
        # The reference trainer's fields are not the kit's: a script's own are its args.
        (
            ["trainer.model=tiny"],
            (
                "1 invalid value(s)\n  - trainer.model: with an entrypoint, trainer: holds only the kit's "
                "fields (checkpoint, dist, faults, ft, inprocess, metrics, seed); your script's own settings "
                "go in entrypoint.args (e.g. [--model, VALUE])"
            ),
        ),
        (["trainer.checkpoint.memory_every=-1"], "checkpoint.memory_every"),
        (["trainer.faults.plan=exception@8:9"], "targets rank 9, but the job has ranks 0..3"),
    ],
)
def test_bad_entrypoint_values_are_one_message_naming_the_field(overrides, message):
    with pytest.raises(UserError) as error:
        load_values(HF_VALUES, overrides)
    assert message in str(error.value)
