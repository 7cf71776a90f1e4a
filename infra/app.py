"""CDK entry point: `npx cdk synth|deploy [-c config=PATH] [-c field=value ...]` (cdk.json runs this).

The only place configuration enters: the YAML file named by the `config` context key (default
infra/configs/default.yaml) plus `-c` overrides of its fields, validated into a `ClusterConfig`.
Synth is offline: account and region come from the config, else from CDK_DEFAULT_ACCOUNT /
CDK_DEFAULT_REGION (set by the CDK CLI when credentials exist), else an explicit placeholder.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from nvrx_eks.infra import DEFAULT_CONFIG, deploy_gate
from nvrx_eks.infra.config import ClusterConfig
from nvrx_eks.infra.deploy_gate import SKIP_CONTEXT_KEY
from nvrx_eks.infra.revision import image_revision
from nvrx_eks.kitcore import paths
from nvrx_eks.kitcore.configio import USER_ERROR_EXIT_CODE, UserError, exit_on_user_error, load_model

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from aws_cdk import App

    from nvrx_eks.infra.stacks.cluster_stack import ClusterStack

# Context keys the CDK CLI itself writes into cdk.context.json (`cdk acknowledge ID`, `cdk
# cli-telemetry --disable`) and reads back on every run: not config fields, and not to be refused.
CDK_CLI_CONTEXT_KEYS = frozenset({"acknowledged-issue-numbers", "cli-telemetry"})
# A syntactically valid account id that no one owns: templates synthesize, deploys need a real one.
PLACEHOLDER_ACCOUNT = "000000000000"
# CDK feature flags the stack relies on, set in code so in-process synth (tests, `nvrx-eks synth`)
# and `npx cdk synth` build the same templates.
FEATURE_FLAGS = {
    # Grant S3 log delivery by bucket policy, not ACLs (ACLs are disabled on every bucket here).
    "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy": True,
}


def load_config(path: str | Path = DEFAULT_CONFIG, overrides: Iterable[str] = ()) -> ClusterConfig:
    return load_model(ClusterConfig, Path(path), overrides, source=str(path))


def overrides_from_context(context: Mapping[str, object]) -> tuple[Path, list[str]]:
    """Split CDK context into the config path and `field=value` overrides of ClusterConfig fields.

    Context keys with ':' or '@' belong to the CDK itself (feature flags, CLI settings) and are left alone;
    any other key must name a config field, so a typo fails instead of being ignored.
    """
    path = Path(str(context.get("config", DEFAULT_CONFIG)))
    # The same path check as every `nvrx-eks` path option, named as the CDK user typed it.
    problem = paths.path_problem(
        path, "read_file", what="cluster config YAML file", example=str(DEFAULT_CONFIG)
    )
    if problem:
        raise UserError(f"-c config={path}: {problem}")
    overrides = []
    for key, value in sorted(context.items()):
        if key in ("config", SKIP_CONTEXT_KEY, *CDK_CLI_CONTEXT_KEYS) or ":" in key or key.startswith("@"):
            continue
        if key.split(".")[0] not in ClusterConfig.model_fields:
            raise UserError(f"context key {key!r} is not a cluster config field; fields: {_field_names()}")
        # `-c key=value` arrives as a string: keep it one (YAML would read 1.30 as 1.3) unless it
        # is a list or mapping; pydantic converts "300" or "true" for numeric and boolean fields.
        structured = isinstance(value, str) and value.lstrip()[:1] in ("[", "{")
        text = value if structured else json.dumps(value)
        overrides.append(f"{key}={text}")
    return path, overrides


def environment_for(config: ClusterConfig, environ: Mapping[str, str]) -> tuple[str, str]:
    account = config.account or environ.get("CDK_DEFAULT_ACCOUNT") or PLACEHOLDER_ACCOUNT
    return account, config.region


def build(app: App, config: ClusterConfig, *, account: str, nag: bool = True) -> ClusterStack:
    """Add the cluster stack (and cdk-nag) to `app`."""
    from aws_cdk import Environment  # noqa: PLC0415 - heavy import, only when building

    from nvrx_eks.infra.nag import add_checks  # noqa: PLC0415
    from nvrx_eks.infra.stacks.cluster_stack import ClusterStack  # noqa: PLC0415

    for flag, value in FEATURE_FLAGS.items():
        app.node.set_context(flag, value)
    # Answer the availability-zone lookup (made by constructs that ask the stack for its AZs) from
    # the config, as a cdk.context.json entry would: synth never needs credentials.
    app.node.set_context(
        f"availability-zones:account={account}:region={config.region}", list(config.availability_zones)
    )
    config = with_node_check_tag(config)
    stack = ClusterStack(app, config=config, env=Environment(account=account, region=config.region))
    if nag:
        add_checks(app)
    return stack


def with_node_check_tag(config: ClusterConfig) -> ClusterConfig:
    """The config with node_check.image_tag set: the given tag, else the content tag of this checkout's
    images (infra/revision.py), the tag `nvrx-eks image build/push` give them: a checkout whose image
    inputs are unchanged names the images already pushed."""
    if config.node_check.image_tag is not None:
        return config
    node_check = config.node_check.model_copy(update={"image_tag": image_revision()})
    return config.model_copy(update={"node_check": node_check})


def synth_summary(config_path: str | Path = DEFAULT_CONFIG, overrides: Iterable[str] = ()) -> str:
    """Synthesize the app in-process (into a temporary folder) and describe what it would deploy."""
    import tempfile  # noqa: PLC0415

    from aws_cdk import App  # noqa: PLC0415

    config = load_config(config_path, overrides)
    account, region = environment_for(config, os.environ)
    with tempfile.TemporaryDirectory(prefix="nvrx-eks-synth-") as outdir:
        started = time.perf_counter()
        app = App(outdir=outdir)
        stack = build(app, config, account=account)
        assembly = app.synth()
        seconds = time.perf_counter() - started
        template = assembly.get_stack_by_name(stack.stack_name).template
    return describe(config, template, account=account, region=region, seconds=seconds)


def describe(
    config: ClusterConfig, template: Mapping[str, object], *, account: str, region: str, seconds: float
) -> str:
    resources = template.get("Resources", {})
    assert isinstance(resources, dict)  # noqa: S101 - CloudFormation templates always map resources
    lines = [
        (
            f"stack {config.name} ({account}/{region}): {len(resources)} resources, "
            f"synthesized in {seconds:.1f} s"
        ),
        (
            f"  EKS {config.kubernetes_version}, endpoint {config.endpoint_access}, AZs "
            f"{', '.join(config.availability_zones)} (GPU: {config.gpu_availability_zone})"
        ),
        (
            f"  FSx for Lustre PERSISTENT_2 {config.fsx.storage_capacity_gib} GiB at "
            f"{config.fsx.throughput_per_tib} MB/s/TiB, linked at {config.fsx.file_system_path}"
        ),
        "  GPU node groups:",
    ]
    for group in config.gpu_node_groups:
        profile = group.profile
        capacity = group.capacity.type + (
            f" {group.capacity.reservation_id}" if group.capacity.reservation_id else ""
        )
        lines.append(
            f"    {group.name:<14} {profile.name:<14} "
            f"{group.min_size}/{group.desired_size}/{group.max_size} nodes "
            f"x {profile.gpus} {profile.accelerator}, {profile.efa_devices} EFA, "
            f"{profile.nvme_count}x{profile.nvme_gib_each} GiB NVMe RAID0, {capacity}"
            f"{', placement group' if group.placement_group else ''}"
        )
    return "\n".join(lines)


# Set by infra/cdk-cli.js (what `npx cdk` runs): the CDK CLI turns the app's exit code 2 into its own
# exit code 1, so the app also leaves its message in this file and the wrapper exits 2.
USER_ERROR_FILE_ENV = "NVRX_EKS_USER_ERROR_FILE"


@contextmanager
def _tell_the_cdk_wrapper() -> Iterator[None]:
    try:
        yield
    except SystemExit as exc:
        marker = os.environ.get(USER_ERROR_FILE_ENV)
        if marker and exc.code == USER_ERROR_EXIT_CODE:
            Path(marker).write_text("the app refused its input; the message is above\n")
        raise


def _field_names() -> str:
    return ", ".join(ClusterConfig.model_fields)


def _gate_deploy(
    config: ClusterConfig, context: Mapping[str, object], *, config_path: str, account: str
) -> None:
    """Refuse a deploy without a recent passing preflight of this config (infra/deploy_gate.py)."""
    reason = deploy_gate.skip_reason(context)
    if reason is not None:
        print(f"warning: deploying {config.name} without a passing preflight: {reason}", file=sys.stderr)
        return
    found = deploy_gate.require_recent_pass(
        config,
        config_path=config_path,
        account=account,
        now=datetime.now(UTC),
        directory=deploy_gate.state_dir(),
    )
    print(f"preflight passed for {config.name} at {found.passed_at:%Y-%m-%d %H:%M} UTC", file=sys.stderr)


def main(context: Mapping[str, object] | None = None) -> None:
    """Entry for `cdk synth/deploy`.

    The CDK CLI passes `-c` context through CDK_CONTEXT_JSON; tests pass `context` directly.
    """
    from aws_cdk import App  # noqa: PLC0415

    with _tell_the_cdk_wrapper(), exit_on_user_error():
        app = App(context=dict(context)) if context is not None else App()
        context = app.node.get_all_context()
        path, overrides = overrides_from_context(context)
        config = load_config(path, overrides)
        account, _ = environment_for(config, os.environ)
        if deploy_gate.is_deploy():
            _gate_deploy(config, context, config_path=str(path), account=account)
        stack = build(app, config, account=account)
        problem = None
        if deploy_gate.skip_reason(context) is None:
            problem = deploy_gate.pass_problem(
                config, account=account, now=datetime.now(UTC), directory=deploy_gate.state_dir()
            )
        if problem is not None:
            deploy_gate.refuse_deploy_in_template(stack, problem=problem, config_path=str(path))
        app.synth()


if __name__ == "__main__":
    main()
