"""`nvrx-eks`: the kit's one command for users.

Each part of the kit owns its subcommands (a `register` function in its `commands` module); this
file only assembles them, so adding a command never touches another part's code.
"""

from __future__ import annotations

import typer

from nvrx_eks.kitcore.configio import exit_on_user_error
from nvrx_eks.node import use_pinned_node

app = typer.Typer(
    name="nvrx-eks",
    help="Fault-tolerant PyTorch training on Amazon EKS with NVIDIA Resiliency Extension.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
job_app = typer.Typer(help="Render, submit and inspect training jobs.", no_args_is_help=True)
local_app = typer.Typer(
    help="Run rendered jobs as local processes or podman containers (no cluster).", no_args_is_help=True
)
image_app = typer.Typer(help="Build and push the training image.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks that print ratios measured in one run.", no_args_is_help=True)
app.add_typer(job_app, name="job")
app.add_typer(local_app, name="local")
app.add_typer(image_app, name="image")
app.add_typer(bench_app, name="bench")


def _register_all() -> None:
    # Imported here so `nvrx-eks --help` stays fast: each module imports its heavy libraries lazily.
    from nvrx_eks.bench import commands as bench_commands  # noqa: PLC0415
    from nvrx_eks.images import commands as image_commands  # noqa: PLC0415
    from nvrx_eks.infra import commands as infra_commands  # noqa: PLC0415
    from nvrx_eks.infra.ops import commands as ops_commands  # noqa: PLC0415
    from nvrx_eks.k8s import commands as k8s_commands  # noqa: PLC0415
    from nvrx_eks.localrun import commands as localrun_commands  # noqa: PLC0415
    from nvrx_eks.planner import commands as planner_commands  # noqa: PLC0415

    infra_commands.register(app=app, bench=bench_app)
    ops_commands.register(app=app, job=job_app)
    k8s_commands.register(job=job_app)
    localrun_commands.register(app=app, local=local_app)
    bench_commands.register(bench=bench_app)
    image_commands.register(image=image_app)
    planner_commands.register(app=app)


def main() -> None:
    # Before any command imports jsii (aws-cdk-lib, cdk8s): the supported Node pinned in package.json.
    use_pinned_node()
    _register_all()
    with exit_on_user_error():
        app()
