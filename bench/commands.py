"""Subcommands the benchmarks and checks add to `nvrx-eks bench` (assembled in nvrx_eks/cli.py): `peer`,
`api`, `scale`, `store` and `checkpoint`. Each is a plain function here, attached by `register`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nvrx_eks.bench.api import DEFAULT_BLOCKS as API_BLOCKS
from nvrx_eks.bench.api import DEFAULT_STEPS as API_STEPS
from nvrx_eks.bench.checkpoint import commands as checkpoint_commands
from nvrx_eks.bench.peer import DEFAULT_DEVICE_STEP_S
from nvrx_eks.bench.scale import DEFAULT_STEPS as SCALE_STEPS
from nvrx_eks.bench.scale import PLAN as SCALE_PLAN
from nvrx_eks.bench.store import (
    DEFAULT_AGENTS,
    DEFAULT_BARRIER_CLIENTS,
    DEFAULT_BARRIER_SIMS,
    RESTART_ROUNDS,
)
from nvrx_eks.k8s import DEFAULT_VALUES
from nvrx_eks.kitcore import paths
from nvrx_eks.kitcore.options import path_option
from nvrx_eks.localrun.commands import LocalValues, RunsRoot  # noqa: TC001 - typer reads the annotations

DeviceStepS = Annotated[
    float, typer.Option(min=0.0, help="Emulated device time per step (0: CPU speed); see bench/peer.py.")
]
_SCALE_JSON = paths.write_file("figures as JSON", "runs/scale.json")
_SCALE_JSON_HELP = "Where the rows go (default: scale.json in the run folder); the PNG goes beside it."
_STORE_JSON = paths.write_file("figures as JSON", "runs/store-bench.json")
ScaleJson = Annotated[Path | None, path_option("--json-out", path=_SCALE_JSON, help=_SCALE_JSON_HELP)]
StoreJson = Annotated[
    Path | None, path_option("--json-out", path=_STORE_JSON, help="Also write the rows as JSON.")
]


def bench_peer_cmd(
    values_file: LocalValues = DEFAULT_VALUES,
    steps: Annotated[int, typer.Option(min=40, help="Steps per run (the same for every mode).")] = 400,
    device_step_s: DeviceStepS = DEFAULT_DEVICE_STEP_S,
    fault_seed: Annotated[
        int | None,
        typer.Option(
            help="Seed of the fault draw (default: 42 for the peer mix, which draws no hang; 50 for "
            "the hardware mix, which draws 4 hardware faults of 5)."
        ),
    ] = None,
    modes: Annotated[
        list[str] | None,
        typer.Option(
            "--mode", help="Run only these modes (repeatable): baseline, inprocess, ft_launcher, both."
        ),
    ] = None,
    mix: Annotated[
        str,
        typer.Option(
            help="The faults drawn: peer (the sample's exception/hang) or hardware "
            "(node loss/SIGKILL/exception, Llama 3's mostly-hardware mix)."
        ),
    ] = "peer",
    runs_root: RunsRoot = Path("runs"),
) -> None:
    """The AWS sample's recovery experiment (5 faults, seed 42), mode by mode; writes peer.json."""
    from nvrx_eks.bench.peer import parse_modes, run_peer_bench  # noqa: PLC0415
    from nvrx_eks.training.resilience.modes import MODES  # noqa: PLC0415

    run_peer_bench(
        values_path=values_file,
        steps=steps,
        device_step_s=device_step_s,
        fault_seed=fault_seed,
        runs_root=runs_root,
        mix=mix,
        modes=parse_modes(modes) if modes else MODES,
    )


def bench_api_cmd(
    steps: Annotated[int, typer.Option(min=20, help="Steps per loop.")] = API_STEPS,
    blocks: Annotated[int, typer.Option(min=1, help="Blocks of (plain, api) loops.")] = API_BLOCKS,
    model: Annotated[str, typer.Option(help="Model preset (training/shapes.py).")] = "tiny",
    against: Annotated[
        str | None,
        typer.Option(help="A git revision: the reference trainer's step cost there and here instead."),
    ] = None,
) -> None:
    """The public API's cost per step against the same loop in plain PyTorch, or the reference
    trainer's against a git revision (bench/api.py)."""
    from nvrx_eks.bench.api import bench_against, bench_api, print_against, print_bench  # noqa: PLC0415

    if against:
        print_against(bench_against(against, steps=max(steps, 40), repeats=blocks))
    else:
        print_bench(bench_api(model_name=model, steps=steps, blocks=blocks))


def bench_scale_cmd(
    values_file: LocalValues = DEFAULT_VALUES,
    nodes: Annotated[
        str, typer.Option("--nodes", help="Node counts to run, comma-separated (1 CPU rank per node).")
    ] = "2,4,8",
    steps: Annotated[
        int, typer.Option(min=1, help=f"Steps per run (the plan's last fault is at {SCALE_PLAN[-1][1]}).")
    ] = SCALE_STEPS,
    device_step_s: DeviceStepS = DEFAULT_DEVICE_STEP_S,
    json_out: Annotated[
        Path | None, path_option("--json-out", path=_SCALE_JSON, help=_SCALE_JSON_HELP)
    ] = None,
    runs_root: RunsRoot = Path("runs"),
) -> None:
    """Recovery against node count: an exception, a SIGKILL, a node loss and a store loss at each
    size, phase by phase; writes the rows as JSON and a PNG of recovery by phase against nodes."""
    from nvrx_eks.bench.scale import parse_nodes, run_scale_bench  # noqa: PLC0415

    run_scale_bench(
        values_path=values_file,
        nodes=parse_nodes(nodes),
        runs_root=runs_root,
        json_out=json_out,
        steps=steps,
        device_step_s=device_step_s,
    )


def bench_store_cmd(
    agents: Annotated[
        list[int] | None,
        typer.Option(
            "--agents", min=2, help="Simulated agents per row (repeatable; default 256, 512, 1024, 2048)."
        ),
    ] = None,
    barrier_clients: Annotated[
        int, typer.Option(min=0, help="Clients through one process-group barrier (0 skips it).")
    ] = DEFAULT_BARRIER_CLIENTS,
    barrier_sims: Annotated[
        list[str] | None,
        typer.Option(
            "--barrier-sim",
            metavar="PROCSxTHREADS",
            help=(
                "How the barrier's clients are simulated: THREADS threads in PROCS processes, each "
                "thread driving its share of the clients (repeatable; default "
                f"{', '.join(s.label for s in DEFAULT_BARRIER_SIMS)}; THREADS = clients: one thread "
                "per rank, minutes at 16,384 on 2 cores)."
            ),
        ),
    ] = None,
    restart_rounds: Annotated[
        int, typer.Option(min=1, help="Restart rounds timed per row (the row is their median).")
    ] = RESTART_ROUNDS,
    json_out: Annotated[
        Path | None, path_option("--json-out", path=_STORE_JSON, help="Also write the rows as JSON.")
    ] = None,
    runs_root: RunsRoot = Path("runs"),
) -> None:
    """The rendezvous store under load: NVRx barrier-rendezvous rounds of 256 to 2,048 simulated
    agents, and a process-group barrier of 16,384 clients per client simulation, against the store
    Deployment's process; prints where the barrier's time goes (the store's loop or the clients)."""
    import time  # noqa: PLC0415

    from nvrx_eks.bench.store import ROUND_GOAL_S, parse_sims, run_store_bench  # noqa: PLC0415

    document = run_store_bench(
        agents=agents or list(DEFAULT_AGENTS),
        barrier_clients=barrier_clients,
        barrier_sims=parse_sims(barrier_sims, clients=barrier_clients) if barrier_sims else None,
        restart_rounds=restart_rounds,
        json_out=json_out,
        log_dir=runs_root / time.strftime("store-bench-%Y%m%d-%H%M%S"),
    )
    goal = document["goal"]
    print(
        f"goal: a round at >= {goal['agents']} agents <= {ROUND_GOAL_S:g} s: "
        f"{'met' if goal['met'] else 'NOT met'}"
    )


def register(*, bench: typer.Typer, **_: typer.Typer) -> None:
    """Attach the benchmarks to `nvrx-eks bench`."""
    bench.command("peer")(bench_peer_cmd)
    bench.command("api")(bench_api_cmd)
    bench.command("scale")(bench_scale_cmd)
    bench.command("store")(bench_store_cmd)
    checkpoint_commands.register(bench)
