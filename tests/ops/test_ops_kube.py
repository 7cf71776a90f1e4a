"""`job submit` / `job status` through the real Kubernetes client, its HTTP layer replaced by a
recorder: the tests assert the requests the client would send (what would be applied), for the
manifests the job chart renders."""

from __future__ import annotations

import base64
import copy
import json
import urllib.parse
from dataclasses import dataclass

import pytest
import urllib3
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.rest import RESTResponse

from nvrx_eks.infra.ops import jobs
from nvrx_eks.infra.ops.kube import (
    APPLY_CONTENT_TYPE,
    CLUSTER_ID_HEADER,
    FIELD_MANAGER,
    TOKEN_PREFIX,
    eks_token,
)
from nvrx_eks.k8s.values import JobValues
from nvrx_eks.kitcore.configio import UserError
from nvrx_eks.training.resilience.config import CONFIG_ENV

IMAGE = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/nvrx-eks/trainer:v1@sha256:{'ab' * 32}"
STORE_IMAGE = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/nvrx-eks/trainer:v1-store@sha256:{'cd' * 32}"


@pytest.fixture(scope="module")
def values() -> JobValues:
    return JobValues(
        name="demo",
        num_nodes=2,
        instance_profile="p5.48xlarge",
        image=IMAGE,
        store_image=STORE_IMAGE,
        storage={"s3_bucket": "ckpt-bucket", "s3_prefix": "checkpoints/"},
        aws_region="us-east-1",
    )


@pytest.fixture(scope="module")
def manifests(values) -> list[dict]:
    return jobs.render(values)


def _pod(name: str, *, phase: str = "Running", waiting: str | None = None, restarts: int = 0) -> dict:
    state = (
        {"waiting": {"reason": waiting, "message": "back-off pulling image"}} if waiting else {"running": {}}
    )
    return {
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/component": "trainer", "nvrx-eks/job": "demo"},
            "annotations": {"batch.kubernetes.io/job-completion-index": name.rsplit("-", 1)[-1]},
        },
        "spec": {"nodeName": f"ip-10-0-0-{len(name)}", "containers": [{"name": "trainer", "image": IMAGE}]},
        "status": {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": "trainer",
                    "image": IMAGE,
                    "imageID": "",
                    "ready": phase == "Running" and not waiting,
                    "restartCount": restarts,
                    "state": state,
                }
            ],
        },
    }


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    headers: dict
    body: object


class Recorder:
    """Stands in for the client's RESTClientObject: records each request and answers it from
    `routes` ((method, path) -> list of (status, body) served in order, the last one repeated)."""

    def __init__(self, routes: dict[tuple[str, str], list[tuple[int, object]]]) -> None:
        self.routes = routes
        self.calls: list[Call] = []

    def request(self, method, url, headers=None, body=None, post_params=None, _request_timeout=None):
        parsed = urllib.parse.urlsplit(url)
        self.calls.append(
            Call(method, parsed.path, dict(urllib.parse.parse_qsl(parsed.query)), dict(headers or {}), body)
        )
        if method == "PATCH" and (method, parsed.path) not in self.routes:
            answer: tuple[int, object] = (200, body)  # an apply answers with the object
        else:
            queue = self.routes.get((method, parsed.path)) or [
                (404, {"kind": "Status", "message": "not found"})
            ]
            answer = queue.pop(0) if len(queue) > 1 else queue[0]
        status, payload = answer
        raw = urllib3.HTTPResponse(
            body=json.dumps(payload).encode(), status=status, headers={"Content-Type": "application/json"}
        )
        return RESTResponse(raw)

    def close(self) -> None:
        pass

    def writes(self) -> list[Call]:
        return [c for c in self.calls if c.method in {"PATCH", "POST", "PUT", "DELETE"}]


def _client(routes) -> tuple[ApiClient, Recorder]:
    configuration = Configuration(host="https://cluster.example")
    client = ApiClient(configuration)
    recorder = Recorder(routes)
    client.rest_client = recorder
    return client, recorder


JOB_PATH = "/apis/batch/v1/namespaces/training/jobs/demo"
PODS_PATH = "/api/v1/namespaces/training/pods"


def _pods(*pods: dict) -> tuple[int, dict]:
    return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(pods)}


def test_submit_applies_the_rendered_manifests_server_side(manifests):
    running = _pods(_pod("demo-rdzv-abc"), _pod("demo-0"), _pod("demo-1"))
    client, rec = _client({("GET", PODS_PATH): [_pods(), running]})
    seen: list[int] = []
    result = jobs.submit(
        client,
        manifests,
        namespace="training",
        on_progress=lambda c: seen.append(c.running),
        sleep=lambda _: None,
    )
    patches = [c for c in rec.calls if c.method == "PATCH"]
    # Everything the chart renders, and nothing else, is applied; the Job last.
    assert len(patches) == len(manifests)
    assert patches[-1].path == JOB_PATH
    by_path = {c.path: c for c in patches}
    for manifest in manifests:
        group = manifest["apiVersion"]
        base = "/api/v1" if group == "v1" else f"/apis/{group}"
        plural = {
            "NetworkPolicy": "networkpolicies",
            "ServiceAccount": "serviceaccounts",
            "Service": "services",
            "Deployment": "deployments",
            "Job": "jobs",
        }[manifest["kind"]]
        call = by_path[f"{base}/namespaces/training/{plural}/{manifest['metadata']['name']}"]
        assert call.headers["Content-Type"] == APPLY_CONTENT_TYPE
        assert call.query == {"fieldManager": FIELD_MANAGER, "force": "true"}
        assert call.body == manifest
    # The Job's existence was checked before anything was written.
    assert rec.calls[0].method == "GET"
    assert rec.calls[0].path == JOB_PATH
    # Pods are followed by the job label until all run (2 nodes + the rendezvous store).
    pod_calls = [c for c in rec.calls if c.path == PODS_PATH]
    assert pod_calls[0].query == {"labelSelector": "nvrx-eks/job=demo"}
    assert seen == [0, 3]
    assert result.pods is not None
    assert result.pods.running == 3
    assert "kubectl logs -n training -f -l nvrx-eks/job=demo" in jobs.follow_hint(
        job_name="demo", namespace="training", num_pods=3
    )


def test_an_existing_job_is_refused_unless_replaced(manifests):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "demo", "namespace": "training"}}
    client, rec = _client({("GET", JOB_PATH): [(200, job)]})
    with pytest.raises(UserError, match=r"already exists .* --replace") as refused:
        jobs.submit(
            client, manifests, namespace="training", wait=False, reach=" --stack s --region us-east-2"
        )
    assert rec.writes() == []
    # The command it suggests reaches the cluster the way the submit did.
    assert "`nvrx-eks job status demo -n training --stack s --region us-east-2`" in str(refused.value)

    client, rec = _client({("GET", JOB_PATH): [(200, job), (200, job), (404, {"message": "gone"})]})
    client.rest_client.routes[("DELETE", JOB_PATH)] = [(200, {"kind": "Status"})]
    jobs.submit(client, manifests, namespace="training", replace=True, wait=False, sleep=lambda _: None)
    writes = rec.writes()
    assert writes[0].method == "DELETE"
    assert writes[0].body["propagationPolicy"] == "Foreground"
    assert [c.method for c in writes[1:]] == ["PATCH"] * len(manifests)


def test_a_pod_that_cannot_pull_its_image_fails_the_submit(manifests):
    client, _ = _client(
        {("GET", PODS_PATH): [_pods(_pod("demo-0", phase="Pending", waiting="ImagePullBackOff"))]}
    )
    with pytest.raises(
        jobs.JobStartError, match=r"demo-0 cannot start: ImagePullBackOff .*nvrx-eks image push"
    ):
        jobs.submit(client, manifests, namespace="training", sleep=lambda _: None)


def test_pods_not_running_in_time_fail_with_what_they_wait_for(manifests):
    pending = _pod("demo-0", phase="Pending")
    pending["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "message": "0/3 nodes: Insufficient nvidia.com/gpu"}
    ]
    pending["status"]["containerStatuses"] = []
    client, _ = _client({("GET", PODS_PATH): [_pods(pending)]})
    with pytest.raises(jobs.JobStartError, match=r"0/3 pods running .*Insufficient nvidia.com/gpu"):
        jobs.submit(client, manifests, namespace="training", timeout_s=0, sleep=lambda _: None)


def test_forbidden_apply_is_one_message_naming_the_access_entry(manifests):
    client, _ = _client(
        {
            ("PATCH", "/api/v1/namespaces/training/services/demo"): [
                (403, {"message": "services is forbidden"})
            ]
        }
    )
    with pytest.raises(UserError, match=r"forbidden to apply Service demo .*access entry"):
        jobs.submit(client, manifests, namespace="training", wait=False)


def test_status_summarises_pods_and_the_latest_complete_checkpoint(manifests, values, moto_session):
    job = next(m for m in manifests if m["kind"] == "Job")
    job = {**job, "status": {"active": 2, "failed": 1}}
    client, _ = _client(
        {
            ("GET", JOB_PATH): [(200, job)],
            ("GET", PODS_PATH): [_pods(_pod("demo-0", restarts=2), _pod("demo-1"))],
        }
    )
    s3 = moto_session.client("s3")
    s3.create_bucket(Bucket="ckpt-bucket")
    # Layout of training/checkpoint/storage.py: step 20 has only one of two ranks committed.
    for step, ranks in ((10, (0, 1)), (20, (0,))):
        for rank in ranks:
            manifest = {
                "step": step,
                "rank": rank,
                "world_size": 2,
                "nbytes": 1,
                "crc32": 0,
                "committed_at": 0,
            }
            key = f"checkpoints/demo/step-{step:09d}/rank-{rank:05d}.json"
            s3.put_object(Bucket="ckpt-bucket", Key=key, Body=json.dumps(manifest).encode())
    status = jobs.job_status(
        client,
        namespace="training",
        name="demo",
        session=moto_session,
        checkpoints_at=jobs.checkpoint_url(values),
    )
    assert (status.active, status.failed, status.parallelism) == (2, 1, 2)
    assert [(p.name, p.restarts, p.index) for p in status.pods] == [("demo-0", 2, "0"), ("demo-1", 0, "1")]
    assert status.checkpoint is not None
    assert status.checkpoint.location == "s3://ckpt-bucket/checkpoints/demo"
    assert (status.checkpoint.step, status.checkpoint.ranks, status.checkpoint.world_size) == (10, 2, 2)


def test_eks_token_is_a_presigned_get_caller_identity_bound_to_the_cluster(plain_session):
    token = eks_token(plain_session, "nvrx-eks")
    assert token.startswith(TOKEN_PREFIX)
    encoded = token.removeprefix(TOKEN_PREFIX)
    url = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    assert parts.netloc == "sts.us-east-1.amazonaws.com"
    assert query["Action"] == "GetCallerIdentity"
    assert query["X-Amz-Expires"] == "60"
    assert CLUSTER_ID_HEADER in query["X-Amz-SignedHeaders"].split(";")
    assert "=" not in encoded


# -- the CLI -------------------------------------------------------------------------------------


@pytest.fixture
def cli(monkeypatch):
    import typer  # noqa: PLC0415
    from typer.testing import CliRunner  # noqa: PLC0415

    from nvrx_eks.infra.ops import commands  # noqa: PLC0415

    app = typer.Typer()
    job = typer.Typer()
    app.add_typer(job, name="job")
    commands.register(app=app, job=job)

    def invoke(*args: str, api_client=None, session=None):
        monkeypatch.setattr(commands, "_api_client", lambda **_: api_client)
        monkeypatch.setattr(commands, "_session", lambda profile, region: session)
        return CliRunner().invoke(app, list(args))

    return invoke


VALUES_FILE = f"""\
name: demo
num_nodes: 2
instance_profile: p5.48xlarge
image: {IMAGE}
store_image: {STORE_IMAGE}
aws_region: us-east-1
storage:
  s3_bucket: ckpt-bucket
"""


def test_submit_cli_applies_waits_and_prints_how_to_follow(cli, manifests, tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text(VALUES_FILE)
    client, rec = _client(
        {("GET", PODS_PATH): [_pods(_pod("demo-rdzv-abc"), _pod("demo-0"), _pod("demo-1"))]}
    )
    result = cli("job", "submit", "-f", str(path), api_client=client)
    assert result.exit_code == 0, result.output
    assert (
        "applied: ServiceAccount/demo-rdzv, NetworkPolicy/demo-ingress, NetworkPolicy/demo-egress, "
        "NetworkPolicy/demo-https, Service/demo-rdzv" in result.output
    )
    assert "kubectl logs -n training -f -l nvrx-eks/job=demo" in result.output
    patched = [c.body for c in rec.calls if c.method == "PATCH"]
    # The store's account and the NetworkPolicies before any pod, Services before the store's Deployment
    # before the Job; each body is a rendered manifest.
    kinds = [m["kind"] for m in patched]
    assert kinds == [
        "ServiceAccount",
        *["NetworkPolicy"] * 3,
        "Service",
        "Service",
        "Deployment",
        "Job",
    ]
    key = lambda m: (m["kind"], m["metadata"]["name"])  # noqa: E731
    assert sorted(patched, key=key) == sorted(manifests, key=key)


def test_submit_cli_exit_codes(cli, tmp_path):
    local = tmp_path / "local.yaml"
    local.write_text("name: demo\nnum_nodes: 1\n")
    result = cli("job", "submit", "-f", str(local), api_client=None)
    assert result.exit_code == 2
    assert "a cluster needs the ECR image" in result.output

    path = tmp_path / "values.yaml"
    path.write_text(VALUES_FILE)
    client, _ = _client(
        {("GET", PODS_PATH): [_pods(_pod("demo-0", phase="Pending", waiting="ErrImagePull"))]}
    )
    result = cli("job", "submit", "-f", str(path), api_client=client)
    assert result.exit_code == 5
    assert "demo-0 cannot start: ErrImagePull" in result.output


def test_status_cli_prints_pods_restarts_and_checkpoint(cli, manifests, moto_session, tmp_path):
    path = tmp_path / "values.yaml"
    path.write_text(VALUES_FILE)
    job = next(m for m in manifests if m["kind"] == "Job")
    client, _ = _client(
        {
            ("GET", JOB_PATH): [(200, {**job, "status": {"active": 2}})],
            ("GET", PODS_PATH): [_pods(_pod("demo-0", restarts=3), _pod("demo-1", restarts=1))],
        }
    )
    s3 = moto_session.client("s3")
    s3.create_bucket(Bucket="ckpt-bucket")
    for rank in (0, 1):
        body = {"step": 40, "rank": rank, "world_size": 2, "nbytes": 1, "crc32": 0, "committed_at": 0}
        s3.put_object(
            Bucket="ckpt-bucket",
            Key=f"checkpoints/demo/step-000000040/rank-{rank:05d}.json",
            Body=json.dumps(body),
        )
    result = cli("job", "status", "demo", "-f", str(path), api_client=client, session=moto_session)
    assert result.exit_code == 0, result.output
    assert "2 active, 0 succeeded, 0 failed of 2 nodes" in result.output
    assert "restarts (all pods): 4" in result.output
    assert "latest checkpoint: step 40 (2/2 ranks)" in result.output


def _stubbed_eks_client(plain_session, **kwargs):
    """`eks_api_client` against a stubbed DescribeCluster of a cluster named nvrx-eks."""
    from botocore.stub import Stubber  # noqa: PLC0415

    from nvrx_eks.infra.ops.kube import eks_api_client  # noqa: PLC0415

    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nnot-checked-offline\n-----END CERTIFICATE-----\n")
    with Stubber(plain_session.client("eks")) as stubber:
        stubber.add_response(
            "describe_cluster",
            {
                "cluster": {
                    "name": "nvrx-eks",
                    "endpoint": "https://ABC.gr7.us-east-1.eks.amazonaws.com",
                    "certificateAuthority": {"data": ca.decode()},
                }
            },
            {"name": "nvrx-eks"},
        )
        return eks_api_client(plain_session, "nvrx-eks", **kwargs)


def test_eks_client_authenticates_with_a_fresh_token(plain_session):
    client = _stubbed_eks_client(plain_session)
    assert client.configuration.host == "https://ABC.gr7.us-east-1.eks.amazonaws.com"
    recorder = Recorder({("GET", PODS_PATH): [_pods()]})
    client.rest_client = recorder
    jobs.list_pods(client, namespace="training", selector="nvrx-eks/job=demo")
    authorization = recorder.calls[0].headers["authorization"]
    assert authorization.startswith(f"Bearer {TOKEN_PREFIX}")


def test_a_tunnel_sends_the_requests_to_the_local_port_and_checks_the_endpoints_name(plain_session):
    """From a workstation: an SSM port-forwarding session forwards a local port to the private
    endpoint; the client connects there and still verifies the certificate as the endpoint's."""
    client = _stubbed_eks_client(plain_session, tunnel_port=8443)
    assert client.configuration.host == "https://127.0.0.1:8443"
    assert client.configuration.tls_server_name == "ABC.gr7.us-east-1.eks.amazonaws.com"
    assert client.configuration.verify_ssl


def test_a_tunnel_without_an_eks_cluster_to_name_is_refused():
    from nvrx_eks.infra.ops import commands  # noqa: PLC0415

    with pytest.raises(UserError, match="--tunnel needs --stack or --cluster"):
        commands._api_client(
            cluster=None, kubeconfig=None, context=None, profile=None, region=None, tunnel=8443
        )


def test_the_next_command_reaches_the_cluster_as_this_one_did():
    from nvrx_eks.infra.ops import commands  # noqa: PLC0415

    reach = commands.ClusterAccess(stack="s", cluster="c", region="us-east-2", tunnel=8443).reach()
    assert reach == " --stack s --region us-east-2 --tunnel 8443"
    assert commands.ClusterAccess(kubeconfig="k", context="x", region="r").reach() == ""


def test_missing_eks_cluster_is_a_user_error(plain_session):
    from botocore.stub import Stubber  # noqa: PLC0415

    from nvrx_eks.infra.ops.kube import eks_api_client  # noqa: PLC0415

    with Stubber(plain_session.client("eks")) as stubber:
        stubber.add_client_error(
            "describe_cluster", service_error_code="ResourceNotFoundException", http_status_code=404
        )
        with pytest.raises(UserError, match="EKS cluster 'nope' not found in us-east-1"):
            eks_api_client(plain_session, "nope")


def test_status_of_an_unknown_job_exits_2(cli):
    client, _ = _client({})
    result = cli("job", "status", "nope", "--no-checkpoints", api_client=client)
    assert result.exit_code == 2
    assert "not found while trying to read Job nope" in result.output


def test_status_names_a_failed_pods_cause_from_its_termination_message(manifests):
    job = next(m for m in manifests if m["kind"] == "Job")
    failed = _pod("demo-1", phase="Failed")
    failed["status"]["containerStatuses"][0]["state"] = {
        "terminated": {
            "exitCode": 1,
            "reason": "Error",
            # The trainer's FallbackToLogsOnError tail: NVRx 0.4.1's launcher out of restarts.
            "message": "Some rank(s) exited with non-zero exit code: {3: ProcessFailure(local_rank=1, "
            "pid=6791, exitcode=-9, error_file='<N/A>', error_file_data={'message': '<NONE>'}, "
            "message='Signal 9 (SIGKILL) received by PID 6791', timestamp=1796123242)}. "
            "Agent's exit code = 1",
        }
    }
    pods = _pods(_pod("demo-0"), failed)
    client, _ = _client({("GET", JOB_PATH): [(200, job)], ("GET", PODS_PATH): [pods]})
    status = jobs.job_status(client, namespace="training", name="demo", checkpoints_at=None)
    view = next(p for p in status.pods if p.name == "demo-1")
    assert view.last_termination == "Error (exit 1): worker rank 3 exit code -9 (Signal 9 (SIGKILL))"


def test_status_names_a_failed_selfchecks_verdict(manifests):
    """A pod whose self-check init container failed: its verdict, not the waiting trainer container."""
    job = next(m for m in manifests if m["kind"] == "Job")
    failed = _pod("demo-1", phase="Failed", waiting="PodInitializing")
    verdict = (
        "cannot train (configuration/image problem, exit 2): checkpoint memory: /checkpoint-memory: "
        "No space left on device; free space on its filesystem, or point checkpoint.memory_dir at another "
        "folder"
    )
    failed["status"]["initContainerStatuses"] = [
        {
            "name": name,
            "image": IMAGE,
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason, "message": message}},
        }
        for name, code, reason, message in (
            ("own-dirs", 0, "Completed", ""),
            ("selfcheck", 2, "Error", f"| checkpoint memory | FAIL (config) | ... |\n{verdict}\n"),
        )
    ]
    pods = _pods(_pod("demo-0"), failed)
    client, _ = _client({("GET", JOB_PATH): [(200, job)], ("GET", PODS_PATH): [pods]})
    status = jobs.job_status(client, namespace="training", name="demo", checkpoints_at=None)
    view = next(p for p in status.pods if p.name == "demo-1")
    assert view.last_termination == f"Error (exit 2): self-check {verdict.removeprefix('cannot train ')}"


def test_status_says_a_job_that_may_shrink_runs_shrunk_while_a_replacement_is_pending(manifests):
    """The job's full and fewest nodes from its trainer's configuration; its size from its pods."""
    job = copy.deepcopy(next(m for m in manifests if m["kind"] == "Job"))
    trainer = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "trainer")
    config = next(e for e in trainer["env"] if e["name"] == CONFIG_ENV)
    config["value"] = json.dumps(
        {**json.loads(config["value"]), "shrink": {"nodes": 2, "node_counts": [1], "after_s": 600}}
    )
    shrunk = _pods(_pod("demo-0"), _pod("demo-1", phase="Pending"))
    client, _ = _client({("GET", JOB_PATH): [(200, job)], ("GET", PODS_PATH): [shrunk]})
    status = jobs.job_status(client, namespace="training", name="demo", checkpoints_at=None)
    assert status.size == "1 of 2 nodes running: shrunk (down to 1 allowed); 1 pending"
    full = _pods(_pod("demo-0"), _pod("demo-1"))
    client, _ = _client({("GET", JOB_PATH): [(200, job)], ("GET", PODS_PATH): [full]})
    status = jobs.job_status(client, namespace="training", name="demo", checkpoints_at=None)
    assert status.size == "2 of 2 nodes running: at its full size; 0 pending"
    # A job that never shrinks says only what runs.
    plain = next(m for m in manifests if m["kind"] == "Job")
    client, _ = _client({("GET", JOB_PATH): [(200, plain)], ("GET", PODS_PATH): [shrunk]})
    status = jobs.job_status(client, namespace="training", name="demo", checkpoints_at=None)
    assert status.size == "1 training pods running, 1 pending"
