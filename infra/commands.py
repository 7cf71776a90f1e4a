"""Subcommands this part adds to `nvrx-eks` (see nvrx_eks/cli.py): `synth` and `bench synth`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nvrx_eks.infra import DEFAULT_CONFIG
from nvrx_eks.kitcore import paths

ConfigOption = Annotated[
    Path,
    typer.Option(
        "--config",
        "-c",
        parser=paths.read_file("cluster config YAML file", "infra/configs/default.yaml"),
        help="Cluster config YAML (infra/configs/*.yaml).",
    ),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set", "-s", help="Override a config field: key=value (repeatable), e.g. region=us-west-2."
    ),
]


def synth(config: ConfigOption = DEFAULT_CONFIG, set_: SetOption = None) -> None:
    """Synthesize the CDK app offline (cdk-nag included) and summarize the stack and GPU node groups."""
    from nvrx_eks.infra.app import synth_summary  # noqa: PLC0415 - aws_cdk is heavy; only when asked

    print(synth_summary(config, set_ or ()))


def bench_synth(
    configs: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="CONFIGS...",
            parser=paths.read_file("cluster config YAML file", "infra/configs/default.yaml"),
            help="Configs to synthesize.",
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, max=5, help="Synths per config in this process.")] = 2,
) -> None:
    """Time in-process synthesis of the whole app per config; the first synth pays jsii start-up."""
    from nvrx_eks.infra.bench_synth import run  # noqa: PLC0415

    run(configs or [DEFAULT_CONFIG, DEFAULT_CONFIG.parent / "p5-capacity-block.yaml"], repeats=repeats)


def register(*, app: typer.Typer, bench: typer.Typer, **_: typer.Typer) -> None:
    """Attach this part's commands to the groups it uses."""
    app.command("synth")(synth)
    bench.command("synth")(bench_synth)
