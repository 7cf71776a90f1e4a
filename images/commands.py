"""`nvrx-eks image build | push | lock | pin`: the training image, with docker, finch or podman; and
`image build --project DIR --base KIT_IMAGE`: a training project's image on the kit's.

Docker is not needed to read this: every command prints the exact command lines it runs, and
`--dry-run` prints them without running anything (images/README.md shows the build end to end).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path  # noqa: TC003 - typer evaluates the options' annotations at runtime
from typing import Annotated

import typer

from nvrx_eks.kitcore import paths

Engine = Annotated[
    str | None,
    typer.Option("--engine", help="docker, finch or podman (default: the first one on PATH, in that order)."),
]
Name = Annotated[str, typer.Option("--name", help="Local image name (the tag comes from --tag).")]
Tag = Annotated[
    str | None,
    typer.Option(
        "--tag",
        help="Image tag (default: img- and a hash of the images' inputs; with --project, its git revision).",
    ),
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the command lines; run nothing.")]


def _run(argv: list[str], *, dry_run: bool, stdin: str | None = None, capture: bool = False) -> str:
    print(f"$ {shlex.join(argv)}", file=sys.stderr)
    if dry_run:
        return ""
    done = subprocess.run(argv, input=stdin, text=True, capture_output=capture, check=False)
    if done.returncode:
        detail = f": {done.stderr.strip()[-2000:]}" if capture and done.stderr else ""
        print(f"error: `{argv[0]} {argv[1]}` exited with {done.returncode}{detail}", file=sys.stderr)
        raise typer.Exit(done.returncode)
    return done.stdout or ""


def _engine(engine: str | None, *, dry_run: bool) -> str:
    from nvrx_eks.images.build import ENGINES, find_engine  # noqa: PLC0415

    if dry_run:  # print what would run even where no engine is installed
        return engine or ENGINES[0]
    return find_engine(engine)


def _tag(tag: str | None) -> str:
    """The given tag, else the images' content tag (infra/revision.py image_revision): the one the
    stack's node check and the job values' fallback name for this checkout."""
    from nvrx_eks.images.build import check_tag  # noqa: PLC0415
    from nvrx_eks.infra.revision import image_revision  # noqa: PLC0415

    return check_tag(tag or image_revision())


def pin(dry_run: DryRun = False) -> None:
    """Record the base image's digest and the EFA installer / aws-ofi-nccl checksums in kitcore/pins.py,
    the store image's base digest and torch wheel checksum, and the digest of every Helm chart image
    (infra/cluster_pins.py)
    (downloads them and asks the registries: run once on a machine with internet; the chart image in
    ECR needs AWS credentials too)."""
    from nvrx_eks.images import pin as pinning  # noqa: PLC0415
    from nvrx_eks.images.build import DOCKERFILE, STORE_DOCKERFILE  # noqa: PLC0415
    from nvrx_eks.infra import cluster_pins  # noqa: PLC0415
    from nvrx_eks.kitcore import pins  # noqa: PLC0415

    before = pins.IMAGE
    values = pinning.resolve(before)
    store = pinning.resolve_store(pins.STORE_IMAGE)
    charts = pinning.resolve_charts(cluster_pins.HELM_CHARTS)
    for prefix, pinned, resolved in (("", before, values), ("STORE_IMAGE.", pins.STORE_IMAGE, store)):
        for name, value in resolved.items():
            was = getattr(pinned, name)
            print(f"{prefix}{name}: {value}" + ("" if was == value else f" (was {was})"))
    for (chart, key), digest in charts.items():
        (was,) = [i.digest for i in cluster_pins.HELM_CHARTS[chart].images if i.values_key == key]
        print(f"HELM_CHARTS[{chart}] {key}: {digest}" + ("" if was == digest else f" (was {was})"))
    if dry_run:
        return
    pinning.record(values, pins=before, dockerfile=DOCKERFILE)
    pinning.record_store(store, pins=pins.STORE_IMAGE, dockerfile=STORE_DOCKERFILE)
    pinning.record_charts(charts)
    print(
        f"recorded in {pinning.PINS_FILE}, {pinning.CLUSTER_PINS_FILE}, {DOCKERFILE} and {STORE_DOCKERFILE}; "
        "commit them",
        file=sys.stderr,
    )
    if values["base_digest"] != before.base_digest:
        print(
            "the base image changed: run `nvrx-eks image lock` to resolve images/requirements.lock in it",
            file=sys.stderr,
        )


def _build(*, engine: str | None, name: str, tag: str | None, dry_run: bool) -> None:
    """Build the training image (images/Dockerfile) and the rendezvous store's image
    (images/store.Dockerfile, tagged TAG-store) with every version from kitcore/pins.py."""
    from nvrx_eks.images.build import (  # noqa: PLC0415
        DOCKERFILE,
        STORE_DOCKERFILE,
        STORE_TAG_SUFFIX,
        build_args,
        build_argv,
        check_verifiable,
        store_build_args,
    )
    from nvrx_eks.infra.revision import source_revision  # noqa: PLC0415
    from nvrx_eks.kitcore import pins  # noqa: PLC0415

    tag = _tag(tag)
    if not dry_run:
        # Fail closed here, before the engine pulls the bases: the Dockerfiles would refuse too.
        check_verifiable(pins.IMAGE, pins.STORE_IMAGE)
    asked = engine
    engine = _engine(engine, dry_run=dry_run)
    print(
        f"engine: {engine} ({'--engine' if asked else 'the first of docker, finch, podman on PATH'})",
        file=sys.stderr,
    )
    # The images' revision label: the commit they were built from, where there is one.
    revision = source_revision() or "unknown"
    builds = (
        (f"{name}:{tag}", build_args(git_revision=revision, pins=pins.IMAGE), None),
        (
            f"{name}:{tag}{STORE_TAG_SUFFIX}",
            store_build_args(git_revision=revision, pins=pins.STORE_IMAGE),
            STORE_DOCKERFILE,
        ),
    )
    for image_name, args, dockerfile in builds:
        _run(
            build_argv(engine=engine, image=image_name, args=args, dockerfile=dockerfile or DOCKERFILE),
            dry_run=dry_run,
        )
    for image_name, _, _ in builds:
        print(image_name)


def _build_project(
    *, project: Path, base: str, engine: str | None, name: str | None, tag: str | None, dry_run: bool
) -> None:
    """Build `project` (its folder the context, images/user.Dockerfile the recipe) on the kit's image."""
    from nvrx_eks.images.build import (  # noqa: PLC0415
        USER_DOCKERFILE,
        build_argv,
        check_image_name,
        check_tag,
        default_project_image_name,
        git_revision,
        project_problems,
        user_build_args,
    )
    from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415

    args = user_build_args(kit_image=base)
    image_name = check_image_name(name or default_project_image_name(project))
    problems = project_problems(project)
    if problems:
        raise UserError("--project: " + "; ".join(problems))
    tag = check_tag(tag or git_revision(project))
    engine = _engine(engine, dry_run=dry_run)
    _run(
        build_argv(
            engine=engine,
            image=f"{image_name}:{tag}",
            args=args,
            dockerfile=USER_DOCKERFILE,
            context=project,
        ),
        dry_run=dry_run,
    )
    print(f"{image_name}:{tag}")


def build(
    engine: Engine = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="Local image name (default: nvrx-eks-training; with --project, the project folder's).",
        ),
    ] = None,
    tag: Tag = None,
    project: Annotated[
        Path | None,
        typer.Option(
            "--project",
            help="A training project's folder: build it on the kit's image (--base) instead.",
            parser=paths.read_folder("training project folder", "."),
        ),
    ] = None,
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            help="With --project: the kit's training image, REPOSITORY:TAG@sha256:DIGEST as "
            "`image push` prints it, or a local NAME:TAG.",
        ),
    ] = None,
    dry_run: DryRun = False,
) -> None:
    """Build the training image (images/Dockerfile) and the rendezvous store's image
    (images/store.Dockerfile, tagged TAG-store) with every version from kitcore/pins.py. With
    --project DIR --base KIT_IMAGE: DIR's code and requirements.txt on the kit's image
    (images/user.Dockerfile), tagged with DIR's git revision."""
    from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415

    if project is None:
        if base is not None:
            raise UserError("--base is the kit's image for a project's build: give --project DIR too")
        _build(engine=engine, name=name or "nvrx-eks-training", tag=tag, dry_run=dry_run)
        return
    if base is None:
        raise UserError(
            "--project needs --base: the kit's training image the project builds on "
            "(`nvrx-eks image push` prints REPOSITORY:TAG@sha256:...)"
        )
    _build_project(project=project, base=base, engine=engine, name=name, tag=tag, dry_run=dry_run)


def push(  # noqa: PLR0917 - typer passes options by keyword; a command has one parameter per option
    stack: Annotated[
        str | None, typer.Option("--stack", help="Cluster stack whose ImageRepositoryUri to push to.")
    ] = None,
    repository: Annotated[
        str | None, typer.Option("--repository", help="ECR repository URI (instead of --stack).")
    ] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="AWS profile.")] = None,
    region: Annotated[str | None, typer.Option("--region", help="AWS region.")] = None,
    engine: Engine = None,
    name: Name = "nvrx-eks-training",
    tag: Tag = None,
    store: Annotated[
        bool,
        typer.Option(
            "--store/--no-store",
            help="Push the store's image (TAG-store) too, as `image build` makes it; --no-store for a "
            "project's image (`image build --project`).",
        ),
    ] = True,
    dry_run: DryRun = False,
) -> None:
    """Push the built images to the cluster's ECR repository; prints REPOSITORY:TAG@DIGEST for the
    trainer (job values `image`) and REPOSITORY:TAG-store@DIGEST for the store (`store_image`)."""
    from nvrx_eks.images.build import (  # noqa: PLC0415
        STORE_TAG_SUFFIX,
        ecr_password,
        login_argv,
        parse_repository_uri,
        push_argvs,
        pushed_digest,
    )
    from nvrx_eks.infra.ops.aws import AwsSession, aws_errors  # noqa: PLC0415
    from nvrx_eks.infra.ops.stack_values import read_stack, with_digest  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import UserError  # noqa: PLC0415

    if bool(stack) == bool(repository):
        raise UserError("pass exactly one of --stack (read ImageRepositoryUri) or --repository URI")
    tag = _tag(tag)
    engine = _engine(engine, dry_run=dry_run)
    session = AwsSession(profile=profile, region=region)
    uri = repository or read_stack(session, stack or "").outputs["ImageRepositoryUri"]
    registry, _ = parse_repository_uri(uri)
    password = ""
    if not dry_run:
        with aws_errors("ecr:GetAuthorizationToken"):
            password = ecr_password(session.client("ecr"), registry)
    _run(login_argv(engine=engine, registry=registry), dry_run=dry_run, stdin=password)
    tags = (tag, f"{tag}{STORE_TAG_SUFFIX}") if store else (tag,)
    for each in tags:
        # The repository's tags are immutable and a default tag names the image inputs: a tag it
        # holds already names an image built from the same inputs, which every deployed object may
        # name. Pushing again would fail; it is kept, and its digest printed below.
        if not dry_run and with_digest(session, f"{uri}:{each}") is not None:
            print(f"{uri}:{each} is in the repository already: kept, not pushed again", file=sys.stderr)
            continue
        for argv in push_argvs(engine=engine, local_image=f"{name}:{each}", repository_uri=uri, tag=each):
            _run(argv, dry_run=dry_run)
    # Jobs take images by digest (k8s/values.py): the registry says which one each tag now names.
    with aws_errors("ecr:DescribeImages"):
        ecr = None if dry_run else session.client("ecr")
        print(
            "\n".join(f"{uri}:{each}" + (f"@{pushed_digest(ecr, uri, each)}" if ecr else "") for each in tags)
        )


def lock(dry_run: DryRun = False) -> None:
    """Regenerate images/torch-requirements.lock and images/requirements.lock: pip's resolver for the
    image's Python and platform (no container engine needed)."""
    from nvrx_eks.images.build import (  # noqa: PLC0415
        LOCK_FILE,
        NOT_TORCH,
        TORCH_LOCK_FILE,
        TORCH_PROVIDED,
        image_requirements,
        lock_argv,
        lock_header,
        parse_report,
        render_lock,
        torch_lock_header,
    )

    argv = lock_argv(python=sys.executable, requirements=image_requirements())
    stdout = _run(argv, dry_run=dry_run, capture=True)
    if dry_run:
        return
    report = parse_report(stdout)
    TORCH_LOCK_FILE.write_text(render_lock(report, header=torch_lock_header(), provided=NOT_TORCH))
    LOCK_FILE.write_text(render_lock(report, header=lock_header(), provided=TORCH_PROVIDED))
    print(TORCH_LOCK_FILE)
    print(LOCK_FILE)


def register(*, image: typer.Typer, **_: typer.Typer) -> None:
    """Attach `image build`, `image push`, `image lock` and `image pin`."""
    image.command("pin")(pin)
    image.command("build")(build)
    image.command("push")(push)
    image.command("lock")(lock)
