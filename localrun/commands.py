"""Subcommands the local run adds to `nvrx-eks` (assembled in nvrx_eks/cli.py): `demo`, `report`, `local
run` and `local shrink`, each a plain function attached by `register`. `LocalValues` and `RunsRoot` are
the options the benchmarks share (bench/commands.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nvrx_eks.k8s import DEFAULT_VALUES
from nvrx_eks.kitcore import paths
from nvrx_eks.kitcore.configio import USER_ERROR_EXIT_CODE
from nvrx_eks.kitcore.options import Overrides, path_option
from nvrx_eks.localrun.shrink import HOLD_S

if TYPE_CHECKING:
    from nvrx_eks.localrun.runtimes import Runtime

_VALUES = paths.read_file("job values YAML file", "k8s/values/local-cpu.yaml")
_RUNS = paths.write_folder("run folders", "runs/")
LocalValues = Annotated[Path, path_option("-f", "--values", path=_VALUES, help="Local job values.")]
RunsRoot = Annotated[Path, path_option("--runs", path=_RUNS, help="Folder for run folders.")]
_CACHE = paths.write_folder("fault-free references", "runs/.cache")
ReferenceCache = Annotated[
    Path | None,
    path_option("--cache", path=_CACHE, help="Fault-free references kept (default: RUNS/.cache)."),
]


def demo_cmd(
    values_file: LocalValues = DEFAULT_VALUES,
    overrides: Overrides = None,
    runs_root: RunsRoot = Path("runs"),
    skip_synth: Annotated[bool, typer.Option("--skip-synth", help="Do not synthesize the CDK app.")] = False,
    cache: ReferenceCache = None,
) -> None:
    """The kit end to end on this machine: synth, render, chaos run with every fault class, report."""
    from nvrx_eks.localrun.demo import demo  # noqa: PLC0415

    code = demo(
        values_path=values_file,
        runs_root=runs_root,
        overrides=tuple(overrides or ()),
        skip_synth=skip_synth,
        cache_dir=cache,
    )
    raise typer.Exit(code)


_DIST = paths.read_folder("folder of one rendered job (nvrx-eks job render -o)", "dist/")
_RUN_DIR = paths.write_folder("run's logs, volumes and results", "runs/local")
DistDir = Annotated[
    Path,
    typer.Argument(
        metavar="DIST_DIR", parser=_DIST, help="Folder with one rendered job (nvrx-eks job render)."
    ),
]
LocalRunDir = Annotated[
    Path, path_option("--run-dir", path=_RUN_DIR, help="Folder for logs, volumes, results.")
]
RuntimeName = Annotated[
    str | None,
    typer.Option(
        "--runtime",
        help="processes (this virtualenv, fast), warm (processes whose `python -m` containers fork "
        "from one interpreter that imported torch: faster still, but pod starts are not a cluster's) "
        "or podman (each container in the images below, as its pod runs it: `make image-check` builds "
        "them). Default: NVRX_EKS_LOCAL_RUNTIME, else processes.",
    ),
]


def run_cmd(  # noqa: PLR0917 - typer maps each option to a parameter
    dist_dir: DistDir,
    run_dir: LocalRunDir = Path("runs/local"),
    delete_node: Annotated[
        list[str] | None,
        typer.Option(
            "--delete-node", help="INDEX@SECONDS: delete that node's pod after SECONDS (repeatable)."
        ),
    ] = None,
    timeout_s: Annotated[float, typer.Option("--timeout", help="Give up after this many seconds.")] = 900.0,
    store_port: Annotated[
        int,
        typer.Option(
            "--store-port", min=0, max=65535, help="Local port of the rendezvous store (0: a free one)."
        ),
    ] = 0,
    node_provision_s: Annotated[
        float,
        typer.Option(
            "--node-provision",
            min=0.0,
            help="Seconds a deleted node's replacement pod stays Pending (its new node coming).",
        ),
    ] = 0.0,
    runtime_name: RuntimeName = None,
    image: Annotated[
        str, typer.Option("--image", help="With --runtime podman: the training image.")
    ] = "localhost/nvrx-eks-local/training:check",
    store_image: Annotated[
        str, typer.Option("--store-image", help="With --runtime podman: the rendezvous store's image.")
    ] = "localhost/nvrx-eks-local/store:check",
) -> None:
    """Run a rendered job as local processes, or each pod's containers in podman (the executor plays
    the Job controller)."""
    from nvrx_eks.localrun.executor import NodeDeletion, load_rendered, run_local, store_ports  # noqa: PLC0415

    runtime = _runtime(runtime_name, image=image, store_image=store_image)
    deletions = [NodeDeletion.parse(item) for item in delete_node or []]
    # --store-port N: the store's declared port(s) map to N, as `kubectl port-forward` would.
    ports = dict.fromkeys(store_ports(load_rendered(dist_dir)), store_port) if store_port else None
    result = run_local(
        dist_dir,
        run_dir=run_dir,
        deletions=deletions,
        timeout_s=timeout_s,
        ports=ports,
        echo=lambda line: print(line, flush=True),
        node_provision_s=node_provision_s,
        runtime=runtime,
    )
    print(f"runtime: {runtime.name}")
    for pod in result.pods:
        print(f"{pod.pod:32} {pod.reason:12} exit={pod.exit_code}  {pod.log}")
    print(f"job {'succeeded' if result.succeeded else 'FAILED'}: {result.reason} ({result.wall_s:.1f} s)")
    raise typer.Exit(0 if result.succeeded else USER_ERROR_EXIT_CODE if result.user_error else 1)


def _runtime(name: str | None, *, image: str, store_image: str) -> Runtime:
    """The `--runtime` by name (None: `NVRX_EKS_LOCAL_RUNTIME`'s, else processes)."""
    from nvrx_eks.localrun.runtimes import runtime_named  # noqa: PLC0415

    return runtime_named(name, image=image, store_image=store_image)


def report_cmd(
    run_dir: Annotated[
        Path,
        typer.Argument(
            metavar="RUN_DIR",
            parser=paths.update_folder("run folder", "runs/demo-YYYYMMDD-HHMMSS"),
            help="A run folder (make demo's, a bench mode's, a trainer run).",
        ),
    ],
) -> None:
    """Write RUN_DIR/report.html: fault table, totals, timeline and bit-identity verdict, one page."""
    from nvrx_eks.localrun.report import report_run  # noqa: PLC0415 - keeps the CLI import light

    print(report_run(run_dir))


def shrink_cmd(
    values_file: LocalValues = DEFAULT_VALUES,
    overrides: Overrides = None,
    run_dir: LocalRunDir = Path("runs/shrink"),
    hold_s: Annotated[
        float,
        typer.Option(
            "--hold",
            min=0.0,
            help="Seconds the lost node's replacement stays Pending (no capacity) before it is scheduled.",
        ),
    ] = HOLD_S,
) -> None:
    """Lose a node with no spare and no capacity: the job shrinks, trains on, grows back when the
    replacement is scheduled, and finishes; then the verdict against a reference that follows the same
    size changes (exit 0 when it holds, 1 when not, 2 for bad input)."""
    from nvrx_eks.localrun.chaos import RunFailed  # noqa: PLC0415
    from nvrx_eks.localrun.shrink import run_shrink_scenario  # noqa: PLC0415

    try:
        report = run_shrink_scenario(
            values_file, run_dir=run_dir, overrides=tuple(overrides or ()), hold_s=hold_s
        )
    except RunFailed as failed:
        print(f"the job did not complete: {failed.reason} (logs: {failed.logs})")
        raise typer.Exit(USER_ERROR_EXIT_CODE if failed.user_error else 1) from None
    for line in report.lines():
        print(line)
    print(f"shrink scenario {'passed' if report.passed else 'FAILED'} (run folder: {run_dir})")
    raise typer.Exit(0 if report.passed else 1)


def register(*, app: typer.Typer, local: typer.Typer, **_: typer.Typer) -> None:
    """Attach this part's commands to the groups it uses."""
    app.command("demo")(demo_cmd)
    local.command("run")(run_cmd)
    local.command("shrink")(shrink_cmd)
    app.command("report")(report_cmd)
