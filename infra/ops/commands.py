"""`nvrx-eks preflight`, `nvrx-eks values`, `nvrx-eks job submit` and `nvrx-eks job status`.

Exit codes (every ops command): 0 ok; 2 input or environment the user fixes (bad config or values,
no credentials, access denied, missing stack or cluster); 3 preflight checks failed; 4 AWS or
Kubernetes unavailable or still throttling after retries; 5 the job's pods could not start.
Heavy libraries (boto3, kubernetes, cdk8s) are imported inside the commands.
"""

from __future__ import annotations

import functools
import inspect
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path  # noqa: TC003 - typer reads the annotations at runtime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nvrx_eks.k8s import names
from nvrx_eks.kitcore import paths

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from kubernetes.client import ApiClient

    from nvrx_eks.infra.ops.aws import AwsSession
    from nvrx_eks.infra.ops.jobs import JobStatus
    from nvrx_eks.infra.ops.kube import PodCounts

_EXIT_CODES = (
    "Exit codes: 0 ok; 2 fix the input/credentials/permissions (the message says how); 3 a preflight "
    "check failed; 4 AWS/Kubernetes unavailable or throttled after retries; 5 pods could not start."
)

Profile = Annotated[str | None, typer.Option("--profile", help="AWS profile (default: the standard chain).")]
Region = Annotated[str | None, typer.Option("--region", help="AWS region (default: the standard chain).")]
Cluster = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        help="EKS cluster to reach with an EKS token from your AWS credentials (stack output "
        "ClusterName); default: the current kubeconfig context.",
    ),
]
Stack = Annotated[
    str | None,
    typer.Option(
        "--stack",
        help="Deployed cluster stack: reach its EKS API as the stack's admin role (output AdminRoleArn, "
        "assumed with your AWS credentials); the endpoint is private by default: run this where the "
        "config's api_access admits, or with --tunnel. Default: --cluster, else the current kubeconfig "
        "context.",
    ),
]
Tunnel = Annotated[
    int | None,
    typer.Option(
        "--tunnel",
        min=1,
        max=65535,
        help="Reach the private API endpoint through this local port, forwarded to it by an SSM "
        "port-forwarding session through a system node (docs/aws.md); with --stack or --cluster.",
    ),
]
Kubeconfig = Annotated[
    str | None, typer.Option("--kubeconfig", help="kubeconfig file (default: ~/.kube/config).")
]
Context = Annotated[str | None, typer.Option("--context", help="kubeconfig context (default: current).")]
_JOB_VALUES = paths.read_file("job values YAML file", "k8s/values/p5-2.yaml")


@contextmanager
def _exit_codes() -> Iterator[None]:
    """One message on stderr and the documented exit code for every failure class, no traceback."""
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

    from nvrx_eks.infra.ops.aws import EXIT_JOB_FAILED, EXIT_SERVICE, ServiceError  # noqa: PLC0415
    from nvrx_eks.infra.ops.jobs import JobStartError  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import USER_ERROR_EXIT_CODE, UserError  # noqa: PLC0415

    try:
        yield
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(USER_ERROR_EXIT_CODE) from None
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_SERVICE) from None
    except (BotoCoreError, ClientError) as exc:
        print(f"error: AWS call failed: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_SERVICE) from None
    except JobStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_JOB_FAILED) from None


def _session(profile: str | None, region: str | None) -> AwsSession:
    from nvrx_eks.infra.ops.aws import AwsSession  # noqa: PLC0415

    return AwsSession(profile=profile, region=region)


def _api_client(
    *,
    stack: str | None = None,
    cluster: str | None,
    kubeconfig: str | None,
    context: str | None,
    profile: str | None,
    region: str | None,
    tunnel: int | None = None,
    check_node_image: bool = False,
) -> ApiClient:
    from nvrx_eks.infra.ops import kube  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415

    if stack is not None:
        from nvrx_eks.infra.ops.stack_values import read_stack, require_node_check_image  # noqa: PLC0415

        session = _session(profile, region)
        info = read_stack(session, stack)
        if check_node_image:
            require_node_check_image(session, info)
        return kube.eks_api_client(session.assume(info.admin_role_arn), info.cluster_name, tunnel_port=tunnel)
    if cluster is not None:
        return kube.eks_api_client(_session(profile, region), cluster, tunnel_port=tunnel)
    if tunnel is not None:
        raise UserError(
            "--tunnel needs --stack or --cluster (the endpoint's name comes from EKS); with a kubeconfig, "
            "set its cluster's server and tls-server-name instead"
        )
    return kube.kubeconfig_api_client(config_file=kubeconfig, context=context)


@dataclass(frozen=True)
class ClusterAccess:
    """How a command reaches the cluster: the options every command that talks to it takes alike."""

    stack: str | None = None
    cluster: str | None = None
    tunnel: int | None = None
    kubeconfig: str | None = None
    context: str | None = None
    profile: str | None = None
    region: str | None = None

    def api_client(self, *, check_node_image: bool = False) -> ApiClient:
        return _api_client(**asdict(self), check_node_image=check_node_image)

    def reach(self) -> str:
        """The options a command reached the cluster with, for the next command it suggests."""
        options: dict[str, str | int | None] = {
            "--stack": self.stack,
            "--cluster": None if self.stack else self.cluster,
        }
        if self.stack or self.cluster:
            options |= {"--region": self.region, "--profile": self.profile, "--tunnel": self.tunnel}
        return "".join(f" {option} {value}" for option, value in options.items() if value is not None)


# Each field's option, in the order `--help` lists them.
_ACCESS_OPTIONS = {
    "stack": Stack,
    "cluster": Cluster,
    "tunnel": Tunnel,
    "kubeconfig": Kubeconfig,
    "context": Context,
    "profile": Profile,
    "region": Region,
}


def _with_cluster_access(command: Callable[..., None]) -> Callable[..., None]:
    """`command`, whose `access: ClusterAccess` parameter typer shows as the options of
    `_ACCESS_OPTIONS` in its place: typer has no option groups, and one definition keeps every
    cluster command's options and their help the same."""
    signature = inspect.signature(command, eval_str=True)
    params = []
    for param in signature.parameters.values():
        if param.name != "access":
            params.append(param)
            continue
        params += [
            inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=option)
            for name, option in _ACCESS_OPTIONS.items()
        ]

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - typer passes what the signature declares
        access = ClusterAccess(**{name: kwargs.pop(name) for name in _ACCESS_OPTIONS})
        command(*args, access=access, **kwargs)

    run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {param.name: param.annotation for param in params}
    return run


def preflight(
    config: Annotated[
        Path,
        typer.Option(
            "-c",
            "--config",
            parser=paths.read_file("cluster config YAML file", "infra/configs/default.yaml"),
            help="Cluster config YAML (infra/configs/*.yaml).",
        ),
    ],
    overrides: Annotated[list[str] | None, typer.Argument(help="key=value overrides of the config.")] = None,
    profile: Profile = None,
    job_values: Annotated[
        Path | None,
        typer.Option(
            "--job-values",
            parser=_JOB_VALUES,
            help="Job values YAML: also check its nodes + spares fit the GPU node group.",
        ),
    ] = None,
) -> None:
    """Check the account can hold the configured GPU node groups, before `cdk deploy`.

    Instance type offered in the GPU AZ, EFA support, the reservation / Capacity Block (state, type,
    AZ, count) and the On-Demand vCPU quota for max nodes x vCPUs. Exit codes: 0 all pass (warnings
    allowed); 2 bad config or no credentials; 3 a check failed; 4 AWS unavailable.
    """
    from datetime import UTC, datetime  # noqa: PLC0415

    from nvrx_eks.infra import deploy_gate  # noqa: PLC0415
    from nvrx_eks.infra.config import ClusterConfig  # noqa: PLC0415
    from nvrx_eks.infra.ops import preflight as checks  # noqa: PLC0415
    from nvrx_eks.infra.ops.aws import EXIT_CHECKS_FAILED  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import load_model  # noqa: PLC0415
    from nvrx_eks.kitcore.console import make_console  # noqa: PLC0415

    with _exit_codes():
        cfg = load_model(ClusterConfig, config, overrides or [])
        # Every input file is read and validated before the first AWS call: a bad values file is
        # reported as itself, not as whatever the credentials chain says first.
        job = None
        if job_values is not None:
            from nvrx_eks.k8s.load import load_values  # noqa: PLC0415

            job = load_values(job_values, [])
        target = checks.target_from_config(cfg)
        # What needs no AWS call first: a job that cannot fit or an image by tag is reported without
        # credentials (offline, in CI), and no AWS call is made for a deploy that would be refused.
        offline = checks.offline_checks(target, config=cfg, job=job)
        results = offline
        if not checks.failed(offline):
            run = checks.Preflight(session=_session(profile, cfg.region), target=target)
            results = run.run_online() + offline
    make_console().print(checks.render_table(results))
    failures = checks.failed(results)
    if failures:
        for r in failures:
            print(
                f"FAIL {r.check} [{r.subject}]: {r.detail}" + (f" -> fix: {r.fix}" if r.fix else ""),
                file=sys.stderr,
            )
        raise typer.Exit(EXIT_CHECKS_FAILED)
    with _exit_codes():
        # `cdk deploy` of this config and account may start now (infra/deploy_gate.py).
        recorded = deploy_gate.record_pass(
            cfg, account=str(run.account), now=datetime.now(UTC), directory=deploy_gate.state_dir()
        )
    print(
        f"preflight passed; recorded in {recorded}: `cdk deploy` of this config may start within "
        f"{deploy_gate.MAX_AGE.total_seconds() / 3600:.0f} h"
    )


def values(
    stack: Annotated[str, typer.Option("--stack", help="Deployed stack name (the cluster config's `name`).")],
    output: Annotated[
        Path,
        typer.Option(
            "-o",
            "--output",
            parser=paths.write_file("job values YAML file", "my-job.yaml"),
            help="Job values YAML to create or update.",
        ),
    ],
    node_group: Annotated[
        str | None, typer.Option("--node-group", help="GPU node group the job runs on (when several).")
    ] = None,
    profile: Profile = None,
    region: Region = None,
) -> None:
    """Write the job values the deployed stack decides into a values file, keeping everything else.

    Sets image (in the stack's ECR repository by digest: your tag or digest if the repository holds
    it, else the tag `nvrx-eks image push` gives this checkout), store_image (the same tag's store
    image, by its digest), namespace,
    service_account, instance_profile, storage.fsx_pvc, storage.s3_bucket, storage.s3_prefix and
    aws_region; comments and other values stay.
    Exit codes: 0 ok; 2 missing stack/outputs, images not pushed, bad values file, no credentials; 4 AWS
    unavailable.
    """
    from pydantic import ValidationError  # noqa: PLC0415

    from nvrx_eks.infra.ops import stack_values  # noqa: PLC0415
    from nvrx_eks.k8s.values import JobValues  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import UserError, describe_validation_error  # noqa: PLC0415

    with _exit_codes():
        doc = stack_values.load_roundtrip(output)  # a bad file is reported before any AWS call
        session = _session(profile, region)
        info = stack_values.read_stack(session, stack)
        current = stack_values.plain(doc)
        updates = stack_values.stack_updates(info, current, node_group=node_group)
        # Only images the stack's repository holds, by digest: a tag or digest copied from an example
        # or another registry would reach the cluster as a pull that never succeeds.
        updates["image"], updates["store_image"] = stack_values.pushed_images(
            session, info, current.get("image")
        )
        changed = stack_values.apply_updates(doc, updates)
        changed += [f"{field} (removed: now aws_region)" for field in stack_values.drop_region_env(doc)]
        missing: list[str] = []
        try:
            JobValues.model_validate(stack_values.plain(doc))
        except ValidationError as exc:
            # Fields only the user can choose (name, num_nodes) may still be missing in a new file.
            missing = [".".join(map(str, e["loc"])) for e in exc.errors() if e["type"] == "missing"]
            if len(missing) != exc.error_count():
                raise UserError(
                    describe_validation_error(exc, source=f"{output} after the stack values")
                ) from None
        stack_values.dump_roundtrip(doc, output)
    print(f"{output}: set {', '.join(changed) or 'nothing (already up to date)'} from stack {stack}")
    if missing:
        print(f"{output}: still to fill in before `nvrx-eks job submit`: {', '.join(missing)}")


@_with_cluster_access
def job_submit(
    values_file: Annotated[Path, typer.Option("-f", "--values", parser=_JOB_VALUES, help="Job values YAML.")],
    overrides: Annotated[list[str] | None, typer.Argument(help="key=value overrides of the values.")] = None,
    *,
    access: ClusterAccess,
    replace: Annotated[
        bool, typer.Option("--replace", help="Delete an existing Job of this name first.")
    ] = False,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until every pod runs.")] = True,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the pods.")] = 1800.0,
) -> None:
    """Render the job chart and apply it to the cluster (server-side apply), then wait for the pods.

    Exit codes: 0 all pods running; 2 bad values, no credentials, forbidden, Job exists; 4 cluster
    unreachable; 5 a pod cannot start (image pull, crash loop) or not all started within --timeout.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    from nvrx_eks.infra.ops import jobs  # noqa: PLC0415
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415
    from nvrx_eks.k8s.nvrx_versions import LOCAL_IMAGE  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415
    from nvrx_eks.kitcore.console import make_console  # noqa: PLC0415

    console = make_console(stderr=True)
    with _exit_codes():
        # The full check `job render` runs (the values' model, then the trainer's own parser on the
        # rendered command line), before any cluster access: a bad field is named here, not in a pod.
        job_values = load_values(values_file, overrides or [])
        if job_values.image == LOCAL_IMAGE:
            raise UserError(
                f"{values_file}: image is {LOCAL_IMAGE!r} (this machine's virtualenv); a cluster needs the "
                "ECR image: run `nvrx-eks values --stack NAME -o VALUES` (`nvrx-eks local run` runs here)"
            )
        manifests = jobs.render(job_values)
        api_client = access.api_client(check_node_image=True)
        expected = jobs.expected_pods(manifests)
        reach = access.reach()
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console,
            transient=False,
        ) as progress:
            task = progress.add_task("pods running", total=expected, detail="applying")

            def _show(counts: PodCounts) -> None:
                progress.update(task, completed=counts.running, detail=counts.line())

            result = jobs.submit(
                api_client,
                manifests,
                namespace=job_values.namespace,
                replace=replace,
                wait=wait,
                timeout_s=timeout,
                on_progress=_show,
                reach=reach,
            )
    print(f"applied: {', '.join(result.applied)}")
    print(
        jobs.follow_hint(job_name=result.job_name, namespace=result.namespace, num_pods=expected, reach=reach)
    )


@_with_cluster_access
def job_status(
    name: Annotated[
        str | None, typer.Argument(help="Job name (default: the `name` of the -f values file).")
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option("-n", "--namespace", help="Namespace of the job (default: the values', else training)."),
    ] = None,
    *,
    access: ClusterAccess,
    values_file: Annotated[
        Path | None,
        typer.Option(
            "-f",
            "--values",
            parser=_JOB_VALUES,
            help="The job's values file: locates its checkpoints in S3.",
        ),
    ] = None,
    checkpoints: Annotated[
        bool, typer.Option("--checkpoints/--no-checkpoints", help="Read the latest checkpoint step from S3.")
    ] = True,
) -> None:
    """Summarise a submitted job: Job counters and conditions, pods, restarts, latest checkpoint step.

    The step is the newest one every rank committed under s3://<s3_bucket>/<s3_prefix><name> (from
    -f VALUES; read with your AWS credentials). Exit codes: 0 ok; 2 no such job / credentials /
    forbidden; 4 cluster unreachable.
    """
    from nvrx_eks.infra.ops import jobs  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415

    with _exit_codes():
        located = None
        if values_file is not None:  # read before any cluster or AWS call (see preflight)
            from nvrx_eks.k8s.values import JobValues  # noqa: PLC0415
            from nvrx_eks.kitcore.configio import load_model  # noqa: PLC0415

            job_values = load_model(JobValues, values_file)
            located = jobs.checkpoint_url(job_values)
            namespace = namespace or job_values.namespace
            name = name or job_values.name
        if name is None:
            raise UserError("name the job: `nvrx-eks job status NAME`, or `-f VALUES` (its `name`)")
        api_client = access.api_client()
        session = _session(access.profile, access.region) if checkpoints else None
        status = jobs.job_status(
            api_client,
            namespace=namespace or names.TRAINING_NAMESPACE,
            name=name,
            session=session,
            checkpoints_at=located,
        )
    _print_job_status(status)


def _print_job_status(status: JobStatus) -> None:
    """The Job's counters and conditions, its pods one row each, their restarts and the latest
    checkpoint step."""
    from rich.table import Table  # noqa: PLC0415

    from nvrx_eks.kitcore.console import make_console  # noqa: PLC0415

    console = make_console()
    console.print(
        f"[bold]{status.namespace}/{status.name}[/]: {status.active} active, {status.succeeded} succeeded, "
        f"{status.failed} failed of {status.parallelism} nodes"
        + (f"; {'; '.join(status.conditions)}" if status.conditions else "")
    )
    console.print(f"size: {status.size}")
    table = Table(show_lines=False)
    for column in ("pod", "index", "component", "phase", "ready", "restarts", "node", "last exit / waiting"):
        table.add_column(column, overflow="fold")
    for p in status.pods:
        table.add_row(
            p.name,
            p.index or "",
            p.component or "",
            p.phase,
            "yes" if p.ready else "no",
            str(p.restarts),
            p.node or "",
            p.waiting_reason or p.last_termination or p.unschedulable or "",
        )
    console.print(table)
    console.print(f"restarts (all pods): {sum(p.restarts for p in status.pods)}")
    ckpt = status.checkpoint
    if ckpt is not None:
        if ckpt.step is not None:
            console.print(
                f"latest checkpoint: step {ckpt.step} ({ckpt.ranks}/{ckpt.world_size} ranks) "
                f"in {ckpt.location}"
            )
        else:
            console.print(f"latest checkpoint: none ({ckpt.note}) in {ckpt.location}")


def register(*, app: typer.Typer, job: typer.Typer, **_: typer.Typer) -> None:
    """Attach `preflight`, `values`, `job submit` and `job status`."""
    epilog = _EXIT_CODES
    app.command("preflight", epilog=epilog)(preflight)
    app.command("values", epilog=epilog)(values)
    job.command("submit", epilog=epilog)(job_submit)
    job.command("status", epilog=epilog)(job_status)
