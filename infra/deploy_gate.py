"""`cdk deploy` starts only after a recent passing `nvrx-eks preflight` of the same config.

Some facts a deploy depends on can be settled only by asking AWS and the chart repositories: that EKS
offers each pinned add-on version for the config's Kubernetes version and takes the kit's configuration
values for it (several pins in infra/cluster_pins.py have no public source), that the version is still
in standard support, that the Capacity Block or reservation exists and matches, that the quota holds
the node groups, that each pinned Helm chart version is published, and, on a deployed stack, that the
new template does not write a node group's size below what it runs; and, offline, that every Helm
chart image is pinned by digest (a chart pulled by a tag its registry may move is refused like an
unoffered add-on version) and the job values, when given, fit the node groups. `nvrx-eks preflight`
asks; when every check passes it
records the pass here, and the app refuses a deploy (exit 2, before anything is created) unless such
a record exists for the same config and account, younger than `MAX_AGE`. `-c skip_preflight="WHY"`
deploys without one and says so.

The CDK CLI runs the app the same way for synth and deploy; infra/cdk-cli.js (what `npx cdk` runs)
tells the app which command it runs through `CDK_COMMAND_ENV`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from nvrx_eks.kitcore.configio import UserError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from aws_cdk import Stack

    from nvrx_eks.infra.config import ClusterConfig

# Where passes are recorded (relative to the working directory, where `npx cdk` and `nvrx-eks` run).
STATE_DIR_ENV = "NVRX_EKS_STATE_DIR"
DEFAULT_STATE_DIR = Path(".nvrx-eks")
# Set by infra/cdk-cli.js to the CDK command that deploys (deploy, watch), absent for synth.
CDK_COMMAND_ENV = "NVRX_EKS_CDK_COMMAND"
DEPLOY_COMMANDS = frozenset({"deploy", "watch"})
SKIP_CONTEXT_KEY = "skip_preflight"
# A Capacity Block's state, the quota and the add-on versions EKS offers change over days; a pass
# older than this says little about the account at deploy time.
MAX_AGE = timedelta(hours=24)
_NOT_A_REASON = frozenset({"", "1", "true", "yes", "y", "on"})


def state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def config_digest(config: ClusterConfig) -> str:
    """sha256 of the validated config, overrides applied; the account is compared on its own."""
    text = config.model_dump_json(exclude={"account"})
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class PreflightPass:
    config_name: str
    config_digest: str
    account: str
    region: str
    passed_at: datetime


def record_path(config_name: str, directory: Path) -> Path:
    return directory / "preflight" / f"{config_name}.json"


def record_pass(config: ClusterConfig, *, account: str, now: datetime, directory: Path) -> Path:
    """Write the pass of `nvrx-eks preflight` for this config and account; returns the file."""
    path = record_path(config.name, directory)
    record = {
        "config_name": config.name,
        "config_digest": config_digest(config),
        "account": account,
        "region": config.region,
        "passed_at": now.astimezone(UTC).isoformat(),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
    except OSError as exc:
        raise UserError(
            f"cannot record the preflight pass in {path} ({exc.strerror}); make {directory} writable "
            f"or point {STATE_DIR_ENV} at a writable folder"
        ) from None
    return path


def read_pass(config_name: str, directory: Path) -> PreflightPass | None:
    path = record_path(config_name, directory)
    try:
        data = json.loads(path.read_text())
        return PreflightPass(
            config_name=str(data["config_name"]),
            config_digest=str(data["config_digest"]),
            account=str(data["account"]),
            region=str(data["region"]),
            passed_at=datetime.fromisoformat(str(data["passed_at"])),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        # Unreadable or hand-edited: as good as none; the message says to run preflight again.
        return None


def pass_problem(config: ClusterConfig, *, account: str, now: datetime, directory: Path) -> str | None:
    """Why no recorded pass admits a deploy of this config and account now; None when one does."""
    found = read_pass(config.name, directory)
    if found is None:
        return f"no passing preflight is recorded for {config.name} in {directory}"
    if found.config_digest != config_digest(config):
        return f"the config changed since preflight passed ({found.passed_at:%Y-%m-%d %H:%M} UTC)"
    if found.account != account:
        return f"preflight passed for account {found.account}, this deploy targets {account}"
    if now - found.passed_at > MAX_AGE:
        hours = (now - found.passed_at).total_seconds() / 3600
        limit = MAX_AGE.total_seconds() / 3600
        return f"the last passing preflight is {hours:.0f} h old (at most {limit:.0f} h)"
    return None


def require_recent_pass(
    config: ClusterConfig, *, config_path: str, account: str, now: datetime, directory: Path
) -> PreflightPass:
    """The recorded pass for this config and account, younger than MAX_AGE; else a UserError saying
    what to run (or how to deploy without it)."""
    run = f"run `nvrx-eks preflight -c {config_path}` (with the same -c overrides) first"
    skip = f'or deploy without it: -c {SKIP_CONTEXT_KEY}="<why>"'
    problem = pass_problem(config, account=account, now=now, directory=directory)
    found = read_pass(config.name, directory)
    if problem is None and found is not None:
        return found
    raise UserError(f"cdk deploy refused: {problem}; {run}, {skip}")


# The gate inside the template: a stack synthesized without a pass carries a rule CloudFormation
# checks before it creates or changes anything, so a deploy that never ran the app's own check (the
# CDK CLI run directly, `cdk deploy --app cdk.out`, a pipeline) is refused too.
GATE_PARAMETER = "PreflightPass"
GATE_RULE = "PreflightPassed"
_NO_PASS = "none"  # noqa: S105 - the parameter's default, not a password


def refuse_deploy_in_template(stack: Stack, *, problem: str, config_path: str) -> None:
    """Add the rule that fails any create or update of `stack`'s template, naming `problem`."""
    from aws_cdk import CfnParameter, CfnRule, CfnRuleAssertion, Fn  # noqa: PLC0415

    parameter = CfnParameter(
        stack,
        GATE_PARAMETER,
        type="String",
        default=_NO_PASS,
        description="[cdk:skip] Set by nothing: this template was synthesized without a passing preflight.",
    )
    CfnRule(
        stack,
        GATE_RULE,
        assertions=[
            CfnRuleAssertion(
                assert_=Fn.condition_not(Fn.condition_equals(parameter.value_as_string, _NO_PASS)),
                assert_description=(
                    f"synthesized without a passing nvrx-eks preflight ({problem}): run `nvrx-eks "
                    f"preflight -c {config_path}`, then `npx cdk deploy` (or -c {SKIP_CONTEXT_KEY}=WHY)"
                ),
            )
        ],
    )


def skip_reason(context: Mapping[str, object]) -> str | None:
    """The reason given with -c skip_preflight=..., None when not given; a bare flag is refused."""
    if SKIP_CONTEXT_KEY not in context:
        return None
    reason = str(context[SKIP_CONTEXT_KEY]).strip()
    if reason.lower() in _NOT_A_REASON:
        raise UserError(
            f'-c {SKIP_CONTEXT_KEY} needs the reason, not a flag: -c {SKIP_CONTEXT_KEY}="Capacity Block '
            'checked by hand in the console"'
        )
    return reason


def is_deploy(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(CDK_COMMAND_ENV, "") in DEPLOY_COMMANDS
