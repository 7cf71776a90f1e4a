"""Subcommands the local run adds to `nvrx-eks` (assembled in nvrx_eks/cli.py): `demo`, `report`,
`bench peer`, `bench api`, `bench scale`, `bench store`, `bench checkpoint`, `local run`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nvrx_eks.kitcore import paths
from nvrx_eks.kitcore.configio import USER_ERROR_EXIT_CODE
from nvrx_eks.localrun.api_bench import DEFAULT_BLOCKS as API_BLOCKS
from nvrx_eks.localrun.api_bench import DEFAULT_STEPS as API_STEPS
from nvrx_eks.localrun.checkpoint_bench import commands as checkpoint_bench_commands
from nvrx_eks.localrun.peer_bench import DEFAULT_DEVICE_STEP_S
from nvrx_eks.localrun.scale_bench import DEFAULT_STEPS as SCALE_STEPS
from nvrx_eks.localrun.scale_bench import PLAN as SCALE_PLAN
from nvrx_eks.localrun.store_bench import (
    DEFAULT_AGENTS,
    DEFAULT_BARRIER_CLIENTS,
    DEFAULT_BARRIER_SIMS,
    RESTART_ROUNDS,
)

LocalValues = Annotated[
    Path,
    typer.Option(
        "-f",
        "--values",
        parser=paths.read_file("job values YAML file", "k8s/values/local-cpu.yaml"),
        help="Local job values.",
    ),
]
RunsRoot = Annotated[
    Path,
    typer.Option("--runs", parser=paths.write_folder("run folders", "runs/"), help="Folder for run folders."),
]


def register(*, app: typer.Typer, local: typer.Typer, bench: typer.Typer, **_: typer.Typer) -> None:
    """Attach this part's commands to the groups it uses."""

    @app.command("demo")
    def demo_cmd(
        values_file: LocalValues = Path("k8s/values/local-cpu.yaml"),
        overrides: Annotated[
            list[str] | None, typer.Option("--set", help="Override a value: key.sub=value (repeatable).")
        ] = None,
        runs_root: RunsRoot = Path("runs"),
        skip_synth: Annotated[
            bool, typer.Option("--skip-synth", help="Do not synthesize the CDK app.")
        ] = False,
    ) -> None:
        """The kit end to end on this machine: synth, render, chaos run with every fault class, report."""
        from nvrx_eks.localrun.demo import demo  # noqa: PLC0415

        code = demo(
            values_path=values_file,
            runs_root=runs_root,
            overrides=tuple(overrides or ()),
            skip_synth=skip_synth,
        )
        raise typer.Exit(code)

    @bench.command("peer")
    def bench_peer_cmd(
        values_file: LocalValues = Path("k8s/values/local-cpu.yaml"),
        steps: Annotated[int, typer.Option(min=40, help="Steps per run (the same for every mode).")] = 400,
        device_step_s: Annotated[
            float,
            typer.Option(
                min=0.0,
                help="Emulated device time per step (0: CPU speed); see localrun/peer_bench.py.",
            ),
        ] = DEFAULT_DEVICE_STEP_S,
        fault_seed: Annotated[
            int | None,
            typer.Option(
                help="Seed of the fault draw (default: 42 for the peer mix, which draws no hang; 50 for "
                "the hardware mix, which draws 4 hardware faults of 5)."
            ),
        ] = None,
        modes: Annotated[
            list[str] | None, typer.Option("--mode", help="Run only these modes (repeatable).")
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
        from nvrx_eks.localrun.peer_bench import run_peer_bench  # noqa: PLC0415

        kwargs = {"modes": tuple(modes)} if modes else {}
        run_peer_bench(
            values_path=values_file,
            steps=steps,
            device_step_s=device_step_s,
            fault_seed=fault_seed,
            runs_root=runs_root,
            mix=mix,
            **kwargs,
        )

    _register_bench_api(bench)

    @bench.command("scale")
    def bench_scale_cmd(
        values_file: LocalValues = Path("k8s/values/local-cpu.yaml"),
        nodes: Annotated[
            str, typer.Option("--nodes", help="Node counts to run, comma-separated (1 CPU rank per node).")
        ] = "2,4,8",
        steps: Annotated[
            int, typer.Option(min=1, help=f"Steps per run (the plan's last fault is at {SCALE_PLAN[-1][1]}).")
        ] = SCALE_STEPS,
        device_step_s: Annotated[
            float,
            typer.Option(
                min=0.0,
                help="Emulated device time per step (0: CPU speed); see localrun/peer_bench.py.",
            ),
        ] = DEFAULT_DEVICE_STEP_S,
        json_out: Annotated[
            Path | None,
            typer.Option(
                "--json-out",
                parser=paths.write_file("figures as JSON", "runs/scale.json"),
                help="Where the rows go (default: scale.json in the run folder); the PNG goes beside it.",
            ),
        ] = None,
        runs_root: RunsRoot = Path("runs"),
    ) -> None:
        """Recovery against node count: an exception, a SIGKILL, a node loss and a store loss at each
        size, phase by phase; writes the rows as JSON and a PNG of recovery by phase against nodes."""
        from nvrx_eks.localrun.scale_bench import parse_nodes, run_scale_bench  # noqa: PLC0415

        run_scale_bench(
            values_path=values_file,
            nodes=parse_nodes(nodes),
            runs_root=runs_root,
            json_out=json_out,
            steps=steps,
            device_step_s=device_step_s,
        )

    @bench.command("store")
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
            Path | None,
            typer.Option(
                "--json-out",
                parser=paths.write_file("figures as JSON", "runs/store-bench.json"),
                help="Also write the rows as JSON.",
            ),
        ] = None,
        runs_root: RunsRoot = Path("runs"),
    ) -> None:
        """The rendezvous store under load: NVRx barrier-rendezvous rounds of 256 to 2,048 simulated
        agents, and a process-group barrier of 16,384 clients per client simulation, against the store
        Deployment's process; prints where the barrier's time goes (the store's loop or the clients)."""
        import time  # noqa: PLC0415

        from nvrx_eks.localrun.store_bench import ROUND_GOAL_S, parse_sims, run_store_bench  # noqa: PLC0415

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

    @local.command("run")
    def run_cmd(  # noqa: PLR0917 - typer maps each option to a parameter
        dist_dir: Annotated[
            Path,
            typer.Argument(
                metavar="DIST_DIR",
                parser=paths.read_folder("folder of one rendered job (nvrx-eks job render -o)", "dist/"),
                help="Folder with one rendered job (nvrx-eks job render).",
            ),
        ],
        run_dir: Annotated[
            Path,
            typer.Option(
                "--run-dir",
                parser=paths.write_folder("run's logs, volumes and results", "runs/local"),
                help="Folder for logs, volumes, results.",
            ),
        ] = Path("runs/local"),
        delete_node: Annotated[
            list[str] | None,
            typer.Option(
                "--delete-node", help="INDEX@SECONDS: delete that node's pod after SECONDS (repeatable)."
            ),
        ] = None,
        timeout_s: Annotated[
            float, typer.Option("--timeout", help="Give up after this many seconds.")
        ] = 900.0,
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
        runtime_name: Annotated[
            str,
            typer.Option(
                "--runtime",
                help="processes (this virtualenv, fast) or podman (each container in the images below, "
                "as its pod runs it: `make image-check` builds them).",
            ),
        ] = "processes",
        image: Annotated[
            str, typer.Option("--image", help="With --runtime podman: the training image.")
        ] = "localhost/nvrx-eks-local/training:check",
        store_image: Annotated[
            str, typer.Option("--store-image", help="With --runtime podman: the rendezvous store's image.")
        ] = "localhost/nvrx-eks-local/store:check",
    ) -> None:
        """Run a rendered job as local processes, or each pod's containers in podman (the executor plays
        the Job controller)."""
        from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415
        from nvrx_eks.localrun.executor import NodeDeletion, load_rendered, run_local, store_ports  # noqa: PLC0415
        from nvrx_eks.localrun.runtimes import Podman, Processes, Runtime  # noqa: PLC0415

        runtimes: dict[str, Runtime] = {
            "processes": Processes(),
            "podman": Podman(trainer_image=image, store_image=store_image),
        }
        if runtime_name not in runtimes:
            raise UserError(f"--runtime {runtime_name!r}: one of {', '.join(runtimes)}")

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
            runtime=runtimes[runtime_name],
        )
        print(f"runtime: {runtimes[runtime_name].name}")
        for pod in result.pods:
            print(f"{pod.pod:32} {pod.reason:12} exit={pod.exit_code}  {pod.log}")
        print(f"job {'succeeded' if result.succeeded else 'FAILED'}: {result.reason} ({result.wall_s:.1f} s)")
        raise typer.Exit(0 if result.succeeded else USER_ERROR_EXIT_CODE if result.user_error else 1)

    @app.command("report")
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

    checkpoint_bench_commands.register(bench)


def _register_bench_api(bench: typer.Typer) -> None:
    """`bench api` (localrun/api_bench.py)."""

    @bench.command("api")
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
        trainer's against a git revision (localrun/api_bench.py)."""
        from nvrx_eks.localrun.api_bench import bench_against, bench_api, print_against, print_bench  # noqa: PLC0415

        if against:
            print_against(bench_against(against, steps=max(steps, 40), repeats=blocks))
        else:
            print_bench(bench_api(model_name=model, steps=steps, blocks=blocks))
