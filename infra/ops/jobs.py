"""`job submit` and `job status` against a real cluster.

submit: render the job chart (the same manifests `nvrx-eks job render` writes), server-side apply them
in dependency order, then follow the pods until every one runs (or one cannot start).

status: the Job's counters and conditions, each pod's phase/restarts/node, and the latest committed
checkpoint step. The step is read from S3, the only checkpoint location reachable from a workstation
(FSx and node-local disks are not): `s3://<storage.s3_bucket>/<storage.s3_prefix><name>` when the
values file is given (the location the chart gives the job), else an s3:// URL on the Job's command
line. A step counts once every rank's manifest is there (the commit protocol of
training/checkpoint/storage.py: `step-NNNNNNNNN/rank-NNNNN.json`).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nvrx_eks.infra.ops.aws import ServiceError, aws_errors
from nvrx_eks.infra.ops.kube import (
    PodCounts,
    PodView,
    apply_order,
    k8s_errors,
    list_pods,
    server_side_apply,
)
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.training.resilience.config import CONFIG_ENV

if TYPE_CHECKING:
    from collections.abc import Callable

    from kubernetes.client import ApiClient

    from nvrx_eks.infra.ops.aws import AwsSession
    from nvrx_eks.k8s.values import JobValues

_STEP_KEY = re.compile(r"(?:^|/)step-(\d{9})/rank-(\d{5})\.json$")
_S3_URL = re.compile(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](?:/[^\s'\"]*)?")


class JobStartError(Exception):
    """Pods of a submitted job cannot start or did not start in time (exit code 5)."""


def job_selector(name: str) -> str:
    from nvrx_eks.k8s.names import JOB_LABEL  # noqa: PLC0415

    return f"{JOB_LABEL}={name}"


def find_job(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    jobs = [m for m in manifests if m["kind"] == "Job"]
    if len(jobs) != 1:
        raise UserError(f"the chart rendered {len(jobs)} Job objects; expected exactly one")
    return jobs[0]


def expected_pods(manifests: list[dict[str, Any]]) -> int:
    """Pods the rendered objects start: the Job's parallelism plus replicas of other workloads."""
    total = 0
    for m in manifests:
        spec = m.get("spec", {})
        if m["kind"] == "Job":
            total += int(spec.get("parallelism", 1))
        elif m["kind"] in {"Deployment", "StatefulSet"}:
            total += int(spec.get("replicas", 1))
        elif m["kind"] == "Pod":
            total += 1
    return total


def _job_exists(api_client: ApiClient, *, namespace: str, name: str) -> bool:
    from kubernetes.client import BatchV1Api  # noqa: PLC0415
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    try:
        BatchV1Api(api_client).read_namespaced_job(name=name, namespace=namespace)
    except ApiException as exc:
        if exc.status == 404:  # noqa: PLR2004
            return False
        with k8s_errors(f"read Job {name}"):
            raise
    return True


def delete_job(
    api_client: ApiClient,
    *,
    namespace: str,
    name: str,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Delete the Job and its pods (foreground) and wait until it is gone."""
    from kubernetes.client import BatchV1Api, V1DeleteOptions  # noqa: PLC0415

    with k8s_errors(f"delete Job {name}"):
        BatchV1Api(api_client).delete_namespaced_job(
            name=name, namespace=namespace, body=V1DeleteOptions(propagation_policy="Foreground")
        )
    deadline = time.monotonic() + timeout_s
    while _job_exists(api_client, namespace=namespace, name=name):
        if time.monotonic() > deadline:
            raise JobStartError(f"Job {name} was not deleted within {timeout_s:.0f} s; check its finalizers")
        sleep(2.0)


@dataclass
class SubmitResult:
    job_name: str
    namespace: str
    applied: list[str] = field(default_factory=list)
    pods: PodCounts | None = None


def submit(
    api_client: ApiClient,
    manifests: list[dict[str, Any]],
    *,
    namespace: str,
    replace: bool = False,
    wait: bool = True,
    timeout_s: float = 1800.0,
    poll_s: float = 2.0,
    on_progress: Callable[[PodCounts], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    reach: str = "",
) -> SubmitResult:
    """Apply the rendered manifests and (optionally) wait until all their pods run; `reach`: the options
    this submit reached the cluster with (` --stack NAME --region R`), for the commands it suggests."""
    job = find_job(manifests)
    job_name = job["metadata"]["name"]
    job_ns = job["metadata"].get("namespace") or namespace
    if _job_exists(api_client, namespace=job_ns, name=job_name):
        if not replace:
            raise UserError(
                f"Job {job_name} already exists in namespace {job_ns} (a Job's pod template cannot be "
                f"changed); check it with `nvrx-eks job status {job_name} -n {job_ns}{reach}`, or pass "
                "--replace to delete "
                "it and its pods first"
            )
        delete_job(api_client, namespace=job_ns, name=job_name, timeout_s=300.0, sleep=sleep)
    result = SubmitResult(job_name=job_name, namespace=job_ns)
    for manifest in apply_order(manifests):
        server_side_apply(api_client, manifest, namespace=namespace)
        result.applied.append(f"{manifest['kind']}/{manifest['metadata']['name']}")
    if wait:
        result.pods = wait_for_pods(
            api_client,
            namespace=job_ns,
            selector=job_selector(job_name),
            expected=expected_pods(manifests),
            timeout_s=timeout_s,
            poll_s=poll_s,
            on_progress=on_progress,
            sleep=sleep,
        )
    return result


def wait_for_pods(
    api_client: ApiClient,
    *,
    namespace: str,
    selector: str,
    expected: int,
    timeout_s: float,
    poll_s: float = 2.0,
    on_progress: Callable[[PodCounts], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> PodCounts:
    """Poll until `expected` pods run; raise JobStartError on a pod that cannot start or on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = PodCounts(
            expected=expected, pods=list_pods(api_client, namespace=namespace, selector=selector)
        )
        if on_progress is not None:
            on_progress(counts)
        if counts.fatal:
            pod = counts.fatal[0]
            raise JobStartError(
                f"pod {pod.name} cannot start: {pod.waiting_reason}"
                + (f" ({pod.waiting_message})" if pod.waiting_message else "")
                + _fatal_hint(pod)
            )
        if counts.running >= expected:
            return counts
        if time.monotonic() > deadline:
            raise JobStartError(
                f"{counts.running}/{expected} pods running after {timeout_s:.0f} s ({counts.line()}); "
                "the job stays submitted: follow it with `nvrx-eks job status`"
            )
        sleep(poll_s)


def _fatal_hint(pod: PodView) -> str:
    if pod.waiting_reason in {"ErrImagePull", "ImagePullBackOff", "InvalidImageName"}:
        return "; push the image (`nvrx-eks image push`) and check `image` in the values file"
    if pod.waiting_reason == "CrashLoopBackOff":
        return f"; read its logs: kubectl logs -p {pod.name}"
    return ""


def follow_hint(*, job_name: str, namespace: str, num_pods: int, reach: str = "") -> str:
    """What to run next; `reach`: the options the submit reached the cluster with (` --stack NAME`)."""
    selector = job_selector(job_name)
    return (
        f"follow the logs:  kubectl logs -n {namespace} -f -l {selector} --prefix "
        f"--max-log-requests {max(num_pods, 5)}\n"
        f"job summary:      nvrx-eks job status {job_name} -n {namespace}{reach}"
    )


# -- status ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CheckpointInfo:
    location: str
    step: int | None
    ranks: int = 0
    world_size: int | None = None
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class JobStatus:
    name: str
    namespace: str
    parallelism: int
    active: int
    succeeded: int
    failed: int
    conditions: list[str]
    pods: list[PodView]
    checkpoint: CheckpointInfo | None
    shrink: tuple[int, int] | None = None
    """(full nodes, fewest nodes) of a job that may shrink (the job values' `shrink`), else None."""

    @property
    def size(self) -> str:
        """How many nodes the job can train on now: its training pods Running, against its full size. A
        job that may shrink trains on those while a lost node's replacement is Pending."""
        running = sum(1 for p in self.pods if p.component != "store" and p.phase == "Running")
        pending = sum(1 for p in self.pods if p.component != "store" and p.phase == "Pending")
        if self.shrink is None:
            return f"{running} training pods running, {pending} pending"
        full, fewest = self.shrink
        state = "at its full size" if running >= full else f"shrunk (down to {fewest} allowed)"
        return f"{min(running, full)} of {full} nodes running: {state}; {pending} pending"


def durable_s3_url(job: dict[str, Any]) -> str | None:
    """The first s3:// URL on the Job's container command lines or env (the durable tier)."""
    for container in job.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        words = [*container.get("command", []), *container.get("args", [])]
        words += [str(e["value"]) for e in container.get("env", []) if e.get("value")]
        for word in words:
            match = _S3_URL.search(str(word))
            if match:
                return match.group(0)
    return None


def latest_checkpoint(session: AwsSession, url: str) -> CheckpointInfo:
    """Newest step under `url` for which every rank's manifest is committed."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    s3 = session.client("s3")
    ranks: dict[int, set[int]] = {}
    first_key: dict[int, str] = {}
    with aws_errors("s3:ListBucket"):
        for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{prefix}/" if prefix else ""
        ):
            for item in page.get("Contents", []):
                match = _STEP_KEY.search(item["Key"])
                if match:
                    step, rank = int(match.group(1)), int(match.group(2))
                    ranks.setdefault(step, set()).add(rank)
                    first_key.setdefault(step, item["Key"])
    for step in sorted(ranks, reverse=True):
        with aws_errors("s3:GetObject"):
            body = s3.get_object(Bucket=bucket, Key=first_key[step])["Body"].read()
        try:
            world = int(json.loads(body)["world_size"])
        except (ValueError, KeyError, TypeError):
            continue
        if len(ranks[step]) >= world:
            return CheckpointInfo(location=url, step=step, ranks=len(ranks[step]), world_size=world)
    return CheckpointInfo(location=url, step=None, note="no complete checkpoint yet")


def checkpoint_url(values: JobValues) -> str | None:
    """Where FSx exports the job's durable tier in S3 (storage.fsx_export_dir is linked to
    s3://BUCKET/PREFIX), None without a bucket."""
    s = values.storage
    if not s.s3_bucket:
        return None
    return "/".join(part for part in (f"s3://{s.s3_bucket}", s.s3_prefix.strip("/"), values.name) if part)


def job_status(
    api_client: ApiClient,
    *,
    namespace: str,
    name: str,
    session: AwsSession | None = None,
    checkpoints_at: str | None = None,
) -> JobStatus:
    """`checkpoints_at`: the job's s3:// checkpoint location (default: found on its command line)."""
    from kubernetes.client import BatchV1Api  # noqa: PLC0415

    with k8s_errors(f"read Job {name}"):
        # Raw JSON rather than the typed model: we read a few fields, and the typed models refuse
        # objects that do not match this client version exactly.
        raw = BatchV1Api(api_client).read_namespaced_job(
            name=name, namespace=namespace, _preload_content=False
        )
    job = json.loads(raw.data)  # type: ignore[attr-defined]  # the raw response, not the typed V1Job
    pods = list_pods(api_client, namespace=namespace, selector=job_selector(name))
    checkpoint = None
    url = checkpoints_at or durable_s3_url(job)
    if url is None:
        checkpoint = CheckpointInfo(
            location="(none)",
            step=None,
            note="no S3 checkpoint location known: pass -f VALUES (with storage.s3_bucket) to read it",
        )
    elif session is not None:
        try:
            checkpoint = latest_checkpoint(session, url)
        except (UserError, ServiceError) as exc:
            checkpoint = CheckpointInfo(location=url, step=None, note=str(exc))
    status = job.get("status", {})
    return JobStatus(
        name=name,
        namespace=namespace,
        parallelism=int(job.get("spec", {}).get("parallelism", 1)),
        active=int(status.get("active", 0)),
        succeeded=int(status.get("succeeded", 0)),
        failed=int(status.get("failed", 0)),
        conditions=[
            f"{c.get('type')}: {c.get('reason', '')} {c.get('message', '')}".strip()
            for c in status.get("conditions", [])
            if c.get("status") == "True"
        ],
        pods=pods,
        checkpoint=checkpoint,
        shrink=_shrink_of(job),
    )


def _shrink_of(job: dict[str, Any]) -> tuple[int, int] | None:
    """(full nodes, fewest nodes) from the trainer's `NVRX_EKS_CONFIG` (its chart-owned `shrink`)."""
    for container in job.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        for env in container.get("env", []):
            if env.get("name") != CONFIG_ENV or not env.get("value"):
                continue
            try:
                shrink = json.loads(env["value"]).get("shrink") or {}
            except (ValueError, AttributeError):
                return None
            counts = shrink.get("node_counts") or []
            return (int(shrink["nodes"]), int(min(counts))) if shrink.get("nodes") and counts else None
    return None


def render(values: JobValues) -> list[dict[str, Any]]:
    """The manifests the job chart renders for `values` (the same files `k8s.job_chart.render` writes)."""
    import tempfile  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    from nvrx_eks.k8s.job_chart import render as render_chart  # noqa: PLC0415 - cdk8s/jsii are heavy

    with tempfile.TemporaryDirectory(prefix="nvrx-eks-render-") as out_dir:
        files = render_chart(values, out_dir)
        return [doc for path in files for doc in yaml.safe_load_all(Path(path).read_text()) if doc]
