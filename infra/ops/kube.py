"""The Kubernetes side of the ops commands: an API client (kubeconfig, or an EKS token from boto3),
server-side apply of rendered manifests, and reading pods back.

EKS authentication is the standard aws-iam-authenticator token (what `aws eks get-token` prints): a
presigned STS GetCallerIdentity URL that carries the `x-k8s-aws-id: <cluster>` header in its
signature, base64url-encoded without padding and prefixed `k8s-aws-v1.`; EKS accepts it for 15
minutes, so the client regenerates it well before then.
https://docs.aws.amazon.com/eks/latest/userguide/cluster-auth.html
"""

from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from nvrx_eks.infra.ops.aws import ServiceError, aws_errors, error_code
from nvrx_eks.kitcore.configio import UserError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from kubernetes.client import ApiClient

    from nvrx_eks.infra.ops.aws import AwsSession

TOKEN_PREFIX = "k8s-aws-v1."  # noqa: S105 - the token format's version prefix, not a secret
CLUSTER_ID_HEADER = "x-k8s-aws-id"
TOKEN_URL_EXPIRES_S = 60
"""The presigned URL's own expiry (as aws-iam-authenticator sets it); EKS honours the token 15 min."""
TOKEN_REFRESH_S = 10 * 60
FIELD_MANAGER = "nvrx-eks"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"

# Apply order: what a workload references (accounts, config, services) before the workload itself.
_KIND_ORDER = (
    "Namespace",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "Secret",
    "NetworkPolicy",  # before the pods it restricts: no moment with the job's ports open
    "PersistentVolumeClaim",
    "Service",
    "PodDisruptionBudget",
    "Pod",
    "Deployment",
    "StatefulSet",
    "Job",
)
# Waiting reasons no amount of waiting fixes (the pod will not start without a change by the user).
FATAL_WAITING_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
        "RunContainerError",
    }
)


def eks_token(session: AwsSession, cluster: str) -> str:
    """A bearer token for EKS cluster `cluster`, signed with the session's credentials."""
    sts = session.client("sts")

    def _take_cluster(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:  # noqa: ANN401
        if "ClusterName" in params:
            context["eks_cluster"] = params.pop("ClusterName")

    def _add_header(request: Any, **_: Any) -> None:  # noqa: ANN401
        if "eks_cluster" in request.context:
            request.headers[CLUSTER_ID_HEADER] = request.context["eks_cluster"]

    events = sts.meta.events
    events.register("provide-client-params.sts.GetCallerIdentity", _take_cluster)
    events.register("before-sign.sts.GetCallerIdentity", _add_header)
    try:
        with aws_errors("sts:GetCallerIdentity (EKS token)"):
            url = sts.generate_presigned_url(
                "get_caller_identity",
                Params={"ClusterName": cluster},
                ExpiresIn=TOKEN_URL_EXPIRES_S,
                HttpMethod="GET",
            )
    finally:
        events.unregister("provide-client-params.sts.GetCallerIdentity", _take_cluster)
        events.unregister("before-sign.sts.GetCallerIdentity", _add_header)
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def eks_api_client(session: AwsSession, cluster: str, *, tunnel_port: int | None = None) -> ApiClient:
    """An ApiClient for EKS cluster `cluster` (endpoint and CA from eks:DescribeCluster).

    `tunnel_port`: reach the endpoint through this port on the local machine, which a port-forwarding
    session (SSM's AWS-StartPortForwardingSessionToRemoteHost, through a node in the cluster security
    group) forwards to it; TLS still checks the endpoint's own name (SNI and certificate)."""
    from kubernetes.config import new_client_from_config_dict  # noqa: PLC0415

    eks = session.client("eks")
    with aws_errors("eks:DescribeCluster"):
        try:
            described = eks.describe_cluster(name=cluster)["cluster"]
        except Exception as exc:
            if error_code(exc) == "ResourceNotFoundException":
                raise UserError(
                    f"EKS cluster {cluster!r} not found in {session.region}; check --cluster/--region "
                    "(the stack output ClusterName names it)"
                ) from None
            raise
    issued = [time.monotonic()]
    token = eks_token(session, cluster)
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {
                    "server": described["endpoint"],
                    "certificate-authority-data": described["certificateAuthority"]["data"],
                    **_through_tunnel(described["endpoint"], tunnel_port),
                },
            }
        ],
        "users": [{"name": "nvrx-eks", "user": {"token": token}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": "nvrx-eks"}}],
        "current-context": cluster,
    }
    client: ApiClient = new_client_from_config_dict(kubeconfig)  # type: ignore[no-untyped-call]

    def _refresh(configuration: Any) -> None:  # noqa: ANN401 - kubernetes Configuration
        if time.monotonic() - issued[0] > TOKEN_REFRESH_S:
            configuration.api_key["authorization"] = "Bearer " + eks_token(session, cluster)
            issued[0] = time.monotonic()

    client.configuration.refresh_api_key_hook = _refresh
    return client


def _through_tunnel(endpoint: str, port: int | None) -> dict[str, str]:
    """The kubeconfig cluster fields that send the requests to a local port and check the endpoint's
    certificate under its own name."""
    if port is None:
        return {}
    import urllib.parse  # noqa: PLC0415

    host = urllib.parse.urlsplit(endpoint).netloc.rsplit("@", 1)[-1].split(":", 1)[0]
    return {"server": f"https://127.0.0.1:{port}", "tls-server-name": host}


def kubeconfig_api_client(*, config_file: str | None = None, context: str | None = None) -> ApiClient:
    from kubernetes.config import ConfigException, new_client_from_config  # noqa: PLC0415

    try:
        client: ApiClient = new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=config_file, context=context, persist_config=False
        )
    except (ConfigException, FileNotFoundError) as exc:
        raise UserError(
            f"cannot load a kubeconfig ({exc}); run `aws eks update-kubeconfig --name CLUSTER`, or pass "
            "--cluster (and --region) to authenticate with your AWS credentials instead"
        ) from None
    return client


def _snake(kind: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", kind).lower()


def _api_for(api_client: ApiClient, api_version: str) -> Any:  # noqa: ANN401 - a generated *Api class
    """The generated API class for an apiVersion (`v1` -> CoreV1Api, `batch/v1` -> BatchV1Api)."""
    from kubernetes import client  # noqa: PLC0415

    group, _, version = api_version.rpartition("/")
    group = (group or "core").removesuffix(".k8s.io")
    name = "".join(part.capitalize() for part in group.split(".")) + version.capitalize() + "Api"
    api_class = getattr(client, name, None)
    if api_class is None:
        raise UserError(f"apiVersion {api_version} is not known to this Kubernetes client")
    return api_class(api_client)


def apply_order(manifests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    rank = {kind: i for i, kind in enumerate(_KIND_ORDER)}
    return sorted(manifests, key=lambda m: rank.get(m["kind"], len(_KIND_ORDER) - 1))


def server_side_apply(api_client: ApiClient, manifest: dict[str, Any], *, namespace: str) -> dict[str, Any]:
    """Server-side apply one object (field manager nvrx-eks, taking over conflicting fields).

    https://kubernetes.io/docs/reference/using-api/server-side-apply/
    """
    api = _api_for(api_client, manifest["apiVersion"])
    kind = _snake(manifest["kind"])
    name = manifest["metadata"]["name"]
    # The answer is returned as JSON, not the client's typed model: we only report it, and typed
    # deserialisation breaks on objects newer than the client's models.
    options = {
        "field_manager": FIELD_MANAGER,
        "force": True,
        "_content_type": APPLY_CONTENT_TYPE,
        "_preload_content": False,
    }
    namespaced = getattr(api, f"patch_namespaced_{kind}", None)
    with k8s_errors(f"apply {manifest['kind']} {name}"):
        if namespaced is not None:
            ns = manifest["metadata"].get("namespace") or namespace
            body = {**manifest, "metadata": {**manifest["metadata"], "namespace": ns}}
            response = namespaced(name=name, namespace=ns, body=body, **options)
        else:
            response = getattr(api, f"patch_{kind}")(name=name, body=manifest, **options)
    applied: dict[str, Any] = json.loads(response.data or b"{}")
    return applied


class _K8sErrors:
    def __init__(self, action: str) -> None:
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> Literal[False]:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415
        from urllib3.exceptions import HTTPError  # noqa: PLC0415

        if isinstance(exc, ApiException):
            raise describe_api_error(exc, action=self.action) from None
        if isinstance(exc, HTTPError):
            raise ServiceError(
                f"cannot reach the Kubernetes API to {self.action} ({exc}); an EKS private endpoint answers "
                "only the networks and security groups the cluster config's api_access lists, or an SSM "
                "port-forwarding session through a node (--tunnel, docs/aws.md)"
            ) from None
        return False


def k8s_errors(action: str) -> _K8sErrors:
    """Translate Kubernetes API failures inside the block into one message each."""
    return _K8sErrors(action)


def describe_api_error(exc: Any, *, action: str) -> UserError | ServiceError:  # noqa: ANN401
    status = int(getattr(exc, "status", 0) or 0)
    reason = _api_message(exc)
    if status == 401:  # noqa: PLR2004
        return UserError(
            f"the cluster rejected our credentials to {action} (401); refresh your kubeconfig "
            "(`aws eks update-kubeconfig`) or your AWS credentials"
        )
    if status == 403:  # noqa: PLR2004
        return UserError(
            f"forbidden to {action} ({reason}); your IAM principal needs an EKS access entry with "
            "edit rights on the namespace (`aws eks create-access-entry` + associate-access-policy)"
        )
    if status == 404:  # noqa: PLR2004
        return UserError(
            f"not found while trying to {action} ({reason}); check the name and the namespace (-n), "
            "and that the cluster stack is deployed"
        )
    if status in {409, 422}:
        return UserError(f"the cluster refused to {action}: {reason}")
    return ServiceError(f"Kubernetes API error {status} while trying to {action}: {reason}")


def _api_message(exc: Any) -> str:  # noqa: ANN401
    body = getattr(exc, "body", None)
    try:
        return str(json.loads(body)["message"])  # type: ignore[arg-type]  # None: TypeError, below
    except (TypeError, ValueError, KeyError):
        return str(getattr(exc, "reason", "") or body or exc)


@dataclass(frozen=True, kw_only=True)
class PodView:
    """What the ops commands show of one pod."""

    name: str
    phase: str
    ready: bool
    restarts: int
    node: str | None
    component: str | None
    index: str | None
    waiting_reason: str | None = None
    waiting_message: str | None = None
    last_termination: str | None = None
    unschedulable: str | None = None

    @property
    def fatal(self) -> bool:
        return self.waiting_reason in FATAL_WAITING_REASONS


def _termination(terminated: Any) -> str | None:  # noqa: ANN401 - V1ContainerStateTerminated
    """Reason and exit code, and for a failure the cause from its termination message (the trainer's
    FallbackToLogsOnError log tail: the launcher's failed ranks, k8s/termination.py)."""
    from nvrx_eks.k8s.termination import failure_cause  # noqa: PLC0415

    if terminated is None:
        return None
    text = f"{terminated.reason} (exit {terminated.exit_code})"
    if terminated.exit_code and terminated.message:
        text += f": {failure_cause(terminated.message).text}"
    return text


def pod_view(pod: Any) -> PodView:  # noqa: ANN401 - V1Pod
    from nvrx_eks.k8s.names import COMPONENT_LABEL  # noqa: PLC0415

    labels = pod.metadata.labels or {}
    annotations = pod.metadata.annotations or {}
    statuses = (pod.status.container_statuses or []) if pod.status else []
    inits = (pod.status.init_container_statuses or []) if pod.status else []
    waiting = next((s.state.waiting for s in statuses if s.state and s.state.waiting), None)
    # A failed pod of the Job (restartPolicy Never) shows its end in `state`, an init container's
    # failure (the self-check's verdict) included; a restarted one in `last_state`.
    failed_init = (
        s.state.terminated for s in inits if s.state and s.state.terminated and s.state.terminated.exit_code
    )
    terminated = (
        next(failed_init, None)
        or next((s.state.terminated for s in statuses if s.state and s.state.terminated), None)
        or next((s.last_state.terminated for s in statuses if s.last_state and s.last_state.terminated), None)
    )
    unschedulable = next(
        (
            c.message
            for c in (pod.status.conditions or [] if pod.status else [])
            if c.type == "PodScheduled" and c.status == "False"
        ),
        None,
    )
    return PodView(
        name=pod.metadata.name,
        phase=(pod.status.phase if pod.status else None) or "Unknown",
        ready=bool(statuses) and all(s.ready for s in statuses),
        restarts=sum(s.restart_count or 0 for s in statuses),
        node=pod.spec.node_name if pod.spec else None,
        component=labels.get(COMPONENT_LABEL),
        index=annotations.get("batch.kubernetes.io/job-completion-index"),
        waiting_reason=waiting.reason if waiting else None,
        waiting_message=waiting.message if waiting else None,
        last_termination=_termination(terminated),
        unschedulable=unschedulable,
    )


@dataclass
class PodCounts:
    expected: int
    pods: list[PodView] = field(default_factory=list)

    @property
    def running(self) -> int:
        return sum(1 for p in self.pods if p.phase in {"Running", "Succeeded"})

    @property
    def fatal(self) -> list[PodView]:
        return [p for p in self.pods if p.fatal]

    def line(self) -> str:
        phases: dict[str, int] = {}
        for p in self.pods:
            phases[p.phase] = phases.get(p.phase, 0) + 1
        text = ", ".join(f"{n} {phase}" for phase, n in sorted(phases.items())) or "no pods yet"
        pending = next((p.unschedulable for p in self.pods if p.unschedulable), None)
        return f"{text}; waiting: {pending}" if pending else text


def list_pods(api_client: ApiClient, *, namespace: str, selector: str) -> list[PodView]:
    from kubernetes.client import CoreV1Api  # noqa: PLC0415

    with k8s_errors(f"list pods in {namespace}"):
        pods = CoreV1Api(api_client).list_namespaced_pod(namespace=namespace, label_selector=selector)
    return sorted((pod_view(p) for p in pods.items), key=lambda p: p.name)
