"""preflight against moto (offerings, instance types, STS) and botocore's Stubber where moto has no
implementation (capacity reservations, service quotas)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from pathlib import Path

import pytest
from botocore.awsrequest import AWSResponse
from botocore.stub import Stubber

from nvrx_eks.infra import cluster_pins
from nvrx_eks.infra.addon_values import MANAGED_ADDON_CONFIGURATION
from nvrx_eks.infra.ops.aws import ServiceError
from nvrx_eks.infra.ops.preflight import (
    BLOCK_SIZE_TAG,
    IMAGE_CHECK,
    AddonTarget,
    NodeGroupTarget,
    Preflight,
    PreflightTarget,
    Status,
    check_reservation,
    image_digest,
    image_targets,
    quota_for,
    target_from_config,
)
from nvrx_eks.kitcore import pins
from nvrx_eks.kitcore.configio import UserError

ROOT = Path(__file__).resolve().parents[2]
P_QUOTA = "L-417A185B"
G_QUOTA = "L-DB2E81BA"


def _target(*groups: NodeGroupTarget, az: str = "us-east-1a") -> PreflightTarget:
    return PreflightTarget(region="us-east-1", availability_zone=az, node_groups=groups)


def _quota_response(code: str, value: float) -> dict:
    return {
        "Quota": {
            "ServiceCode": "ec2",
            "QuotaCode": code,
            "QuotaName": "Running On-Demand instances",
            "Value": value,
            "Unit": "None",
        }
    }


def _stub_quotas(session, *quotas: tuple[str, float]) -> Stubber:
    stubber = Stubber(session.client("service-quotas"))
    for code, value in quotas:
        stubber.add_response(
            "get_service_quota", _quota_response(code, value), {"ServiceCode": "ec2", "QuotaCode": code}
        )
    stubber.activate()
    return stubber


def _by_check(results, check: str, subject: str | None = None):
    [found] = [r for r in results if r.check == check and (subject is None or r.subject == subject)]
    return found


P5 = NodeGroupTarget(name="p5", instance_type="p5.48xlarge", max_nodes=2)


def test_all_checks_pass_for_an_offered_efa_type_within_quota(moto_session):
    stubber = _stub_quotas(moto_session, (P_QUOTA, 384))
    results = Preflight(session=moto_session, target=_target(P5)).run()
    stubber.assert_no_pending_responses()
    assert [r.status for r in results] == [Status.PASS] * 4
    assert "123456789012" in _by_check(results, "credentials").detail
    assert "384 vCPUs, quota is 384" in _by_check(results, "On-Demand vCPU quota").detail


def test_type_not_offered_in_the_az_names_the_zones_that_offer_it(moto_session):
    # moto's offering data (from AWS) has p4d.24xlarge in us-east-1a..d only.
    group = NodeGroupTarget(name="p4d", instance_type="p4d.24xlarge", max_nodes=1)
    _stub_quotas(moto_session, (P_QUOTA, 1000))
    results = Preflight(session=moto_session, target=_target(group, az="us-east-1f")).run()
    offered = _by_check(results, "instance type offered")
    assert offered.status is Status.FAIL
    assert "not offered in us-east-1f" in offered.detail
    assert "us-east-1a" in offered.fix
    assert "us-east-1f" not in offered.fix


def test_type_without_efa_fails_and_uses_the_standard_quota(moto_session):
    group = NodeGroupTarget(name="cpu", instance_type="t3.micro", max_nodes=3)
    _stub_quotas(moto_session, ("L-1216C47A", 1152))
    results = Preflight(session=moto_session, target=_target(group)).run()
    assert _by_check(results, "EFA supported").status is Status.FAIL
    assert _by_check(results, "On-Demand vCPU quota").status is Status.PASS


def test_quota_too_small_fails_with_the_increase_command(moto_session):
    _stub_quotas(moto_session, (P_QUOTA, 192))
    results = Preflight(session=moto_session, target=_target(P5)).run()
    quota = _by_check(results, "On-Demand vCPU quota")
    assert quota.status is Status.FAIL
    assert "need 2 x 192 (p5) = 384 vCPUs, quota is 192" in quota.detail
    assert f"--quota-code {P_QUOTA} --desired-value 384" in quota.fix


def test_each_quota_sums_its_own_node_groups(moto_session):
    groups = (
        NodeGroupTarget(name="g6", instance_type="g6.8xlarge", max_nodes=4),
        NodeGroupTarget(name="p5a", instance_type="p5.48xlarge", max_nodes=2),
        NodeGroupTarget(name="p5b", instance_type="p5.48xlarge", max_nodes=1),
    )
    # G and VT: 4 x 32 = 128 fits; P: (2 + 1) x 192 = 576 does not fit 500.
    stubber = _stub_quotas(moto_session, (G_QUOTA, 128), (P_QUOTA, 500))
    results = Preflight(session=moto_session, target=_target(*groups)).run()
    stubber.assert_no_pending_responses()
    quotas = {r.detail.split(":")[0]: r for r in results if r.check == "On-Demand vCPU quota"}
    assert quotas[G_QUOTA].status is Status.PASS
    assert quotas[P_QUOTA].status is Status.FAIL
    assert "= 576 vCPUs" in quotas[P_QUOTA].detail


def test_access_denied_on_one_api_fails_that_check_only(moto_session):
    stubber = Stubber(moto_session.client("service-quotas"))
    stubber.add_client_error(
        "get_service_quota",
        service_error_code="AccessDeniedException",
        service_message="not allowed",
        http_status_code=403,
    )
    stubber.activate()
    results = Preflight(session=moto_session, target=_target(P5)).run()
    quota = _by_check(results, "On-Demand vCPU quota")
    assert quota.status is Status.FAIL
    assert "servicequotas:GetServiceQuota" in quota.detail
    assert _by_check(results, "EFA supported").status is Status.PASS


@pytest.mark.parametrize(
    ("family", "code"),
    [
        ("p5en.48xlarge", P_QUOTA),
        ("g6.8xlarge", G_QUOTA),
        ("trn2.48xlarge", "L-2C3B7624"),
        ("m7i.xlarge", "L-1216C47A"),
    ],
)
def test_quota_codes_by_family(family, code):
    assert quota_for(family)[0] == code


def test_no_credentials_is_one_user_error(make_session, monkeypatch):
    # No mock here (moto would provide fake credentials): botocore fails before sending anything.
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(UserError, match="no AWS credentials found"):
        Preflight(session=make_session(), target=_target(P5)).run()


# -- reservations and Capacity Blocks (Stubber: moto lacks DescribeCapacityReservations) ----------

END = dt.datetime(2030, 1, 2, 3, 0, tzinfo=dt.UTC)


def _reservation(**overrides) -> dict:
    reservation = {
        "CapacityReservationId": "cr-0123456789abcdef0",
        "InstanceType": "p5.48xlarge",
        "AvailabilityZone": "us-east-1a",
        "TotalInstanceCount": 2,
        "AvailableInstanceCount": 2,
        "State": "active",
        "ReservationType": "capacity-block",
        "EndDate": END,
        "Tags": [],
    }
    reservation.update(overrides)
    return reservation


def _check(session, reservation: dict | None, *, capacity="capacity_block", max_nodes=2, error=None):
    ec2 = session.client("ec2")
    group = NodeGroupTarget(
        name="p5-block",
        instance_type="p5.48xlarge",
        max_nodes=max_nodes,
        capacity=capacity,
        reservation_id="cr-0123456789abcdef0",
    )
    with Stubber(ec2) as stubber:
        expected = {"CapacityReservationIds": ["cr-0123456789abcdef0"]}
        if error:
            stubber.add_client_error(
                "describe_capacity_reservations", service_error_code=error, expected_params=expected
            )
        else:
            stubber.add_response(
                "describe_capacity_reservations", {"CapacityReservations": [reservation]}, expected
            )
        result = check_reservation(ec2, group, availability_zone="us-east-1a", region="us-east-1")
        stubber.assert_no_pending_responses()
    return result


def test_matching_active_capacity_block_passes(plain_session):
    result = _check(plain_session, _reservation())
    assert result.status is Status.PASS
    assert "2 x p5.48xlarge in us-east-1a" in result.detail
    assert "2030-01-02" in result.detail


def test_scheduled_capacity_block_counts_its_size_tag(plain_session):
    # Before a block starts its counts read 0; the size is in a tag (EC2 user guide, capacity-blocks-view).
    pending = _reservation(
        State="scheduled",
        TotalInstanceCount=0,
        AvailableInstanceCount=0,
        Tags=[{"Key": BLOCK_SIZE_TAG, "Value": "4"}],
    )
    assert _check(plain_session, pending, max_nodes=4).status is Status.PASS
    assert _check(plain_session, pending, max_nodes=5).status is Status.FAIL


def test_reservation_mismatches_are_each_named_with_a_fix(plain_session):
    wrong = _reservation(InstanceType="p4d.24xlarge", AvailabilityZone="us-east-1b", TotalInstanceCount=1)
    result = _check(plain_session, wrong)
    assert result.status is Status.FAIL
    assert "holds p4d.24xlarge, node group uses p5.48xlarge" in result.detail
    assert "is in us-east-1b, cluster uses us-east-1a" in result.detail
    assert "holds 1 instance(s), node group max is 2" in result.detail
    assert "gpu_availability_zone to us-east-1b" in result.fix
    assert "max_size to 1" in result.fix


@pytest.mark.parametrize("state", ["expired", "cancelled", "payment-failed"])
def test_unusable_states_fail(plain_session, state):
    result = _check(plain_session, _reservation(State=state))
    assert result.status is Status.FAIL
    assert f"state is {state}" in result.detail


def test_a_capacity_block_configured_as_a_reservation_fails(plain_session):
    result = _check(plain_session, _reservation(), capacity="capacity_reservation")
    assert result.status is Status.FAIL
    assert "set capacity.type capacity_block" in result.fix


def test_missing_reservation_fails_with_how_to_find_it(plain_session):
    result = _check(plain_session, None, error="InvalidCapacityReservationId.NotFound")
    assert result.status is Status.FAIL
    assert "not found in us-east-1" in result.detail


def test_capacity_block_quota_shortfall_is_a_warning(moto_session, monkeypatch):
    block = NodeGroupTarget(
        name="p5-block",
        instance_type="p5.48xlarge",
        max_nodes=2,
        capacity="capacity_block",
        reservation_id="cr-1",
    )
    preflight = Preflight(session=moto_session, target=_target(block))
    ec2 = moto_session.client("ec2")
    _stub_quotas(moto_session, (P_QUOTA, 0))
    # The reservation lookup goes through a Stubber; offerings and instance types stay on moto.
    stub_client = moto_session.session.client("ec2", region_name="us-east-1")
    monkeypatch.setattr(ec2, "describe_capacity_reservations", stub_client.describe_capacity_reservations)
    with Stubber(stub_client) as stubber:
        stubber.add_response(
            "describe_capacity_reservations",
            {"CapacityReservations": [_reservation(CapacityReservationId="cr-1")]},
        )
        results = preflight.run()
    assert _by_check(results, "capacity reservation").status is Status.PASS
    assert _by_check(results, "On-Demand vCPU quota").status is Status.WARN


# -- retries -----------------------------------------------------------------------------------------


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_):
        yield self._body


def _throttle_first(client, operation: str, times: int) -> list[int]:
    """Answer the first `times` HTTP attempts of `operation` with EC2's throttling error, then let
    moto answer. Registered first on before-send, i.e. below botocore's retry handler."""
    attempts: list[int] = []
    body = (
        b"<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded."
        b"</Message></Error></Errors><RequestID>r-1</RequestID></Response>"
    )

    def handler(request, **_):
        attempts.append(1)
        if len(attempts) <= times:
            return AWSResponse(request.url, 503, {}, _Raw(body))
        return None

    client.meta.events.register_first(f"before-send.ec2.{operation}", handler)
    return attempts


def test_throttling_is_retried_by_botocore(moto_session):
    ec2 = moto_session.client("ec2")
    attempts = _throttle_first(ec2, "DescribeInstanceTypeOfferings", times=2)
    _stub_quotas(moto_session, (P_QUOTA, 384))
    results = Preflight(session=moto_session, target=_target(P5)).run()
    assert len(attempts) == 3
    assert _by_check(results, "instance type offered").status is Status.PASS


def test_throttling_past_the_users_max_attempts_is_one_message(make_session, monkeypatch):
    from moto import mock_aws  # noqa: PLC0415

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # the user's setting wins over the kit's default
    with mock_aws():
        session = make_session()
        attempts = _throttle_first(session.client("ec2"), "DescribeInstanceTypes", times=10)
        with pytest.raises(ServiceError, match=r"throttled ec2:DescribeInstanceTypes .* after 2 attempt"):
            Preflight(session=session, target=_target(P5))._instance_info("p5.48xlarge")
    assert len(attempts) == 2


# -- the CLI -------------------------------------------------------------------------------------

CONFIG = """\
name: nvrx-eks
region: us-east-1
availability_zones: [us-east-1a, us-east-1b]
gpu_availability_zone: us-east-1a
gpu_node_groups:
  - name: g6-dev
    instance_type: g6.8xlarge
    max_size: 4
  - name: p5-ondemand
    instance_type: p5.48xlarge
    max_size: 8
"""


def _with_chart_digests(monkeypatch, *, unpublished: tuple[str, ...] = ()) -> None:
    """Every chart image pinned by a digest (one made up from its reference), except the charts named."""

    def pinned(name: str, image: cluster_pins.ChartImage) -> cluster_pins.ChartImage:
        if name in unpublished:
            return dataclasses.replace(image, digest=pins.UNPUBLISHED_SHA256)
        return dataclasses.replace(image, digest=f"sha256:{hashlib.sha256(image.tag.encode()).hexdigest()}")

    charts = {
        name: dataclasses.replace(chart, images=tuple(pinned(name, i) for i in chart.images))
        for name, chart in cluster_pins.HELM_CHARTS.items()
    }
    monkeypatch.setattr(cluster_pins, "HELM_CHARTS", charts)


@pytest.fixture
def preflight_cli(moto_session, monkeypatch, tmp_path):
    import typer  # noqa: PLC0415
    from typer.testing import CliRunner  # noqa: PLC0415

    from nvrx_eks.infra.ops import commands  # noqa: PLC0415

    monkeypatch.setattr(commands, "_session", lambda profile, region: moto_session)
    monkeypatch.setenv("NVRX_EKS_STATE_DIR", str(tmp_path / "state"))
    app = typer.Typer()
    job = typer.Typer()
    app.add_typer(job, name="job")
    commands.register(app=app, job=job)
    config = tmp_path / "cluster.yaml"
    config.write_text(CONFIG)
    _with_chart_digests(monkeypatch)

    def invoke(*extra: str):
        return CliRunner().invoke(app, ["preflight", "-c", str(config), *extra])

    return invoke


def test_preflight_cli_passes_with_enough_quota(preflight_cli, moto_session):
    _stub_quotas(moto_session, (G_QUOTA, 128), (P_QUOTA, 1536))
    _stub_pinned_addons(moto_session, cluster_pins.DEFAULT_KUBERNETES_VERSION)
    result = preflight_cli()
    assert result.exit_code == 0, result.output
    assert "fail" not in result.output
    # credentials + Kubernetes support + 2 x (offered, EFA) + 2 quotas + one row per pinned add-on, per
    # chart version and per chart image, and the line saying the pass was recorded for `cdk deploy`
    table, recorded = result.output.split("preflight passed; recorded in")
    images = sum(len(chart.images) for chart in cluster_pins.HELM_CHARTS.values())
    # + 2 x live node group size (not deployed yet)
    assert table.count("pass") == 10 + len(cluster_pins.EKS_ADDONS) + len(cluster_pins.HELM_CHARTS) + images
    assert table.count("not deployed yet") == 2
    # The node check by tag (no node_check.image_digest) warns and does not stop the pass.
    assert table.count("warn") == 1
    assert "state/preflight/nvrx-eks.json: `cdk deploy` of this config may start within 24 h" in recorded


def test_preflight_cli_exits_3_naming_the_failure_and_fix(preflight_cli, moto_session, tmp_path):
    _stub_quotas(moto_session, (G_QUOTA, 128), (P_QUOTA, 1000))
    _stub_pinned_addons(moto_session, cluster_pins.DEFAULT_KUBERNETES_VERSION)
    result = preflight_cli()
    assert result.exit_code == 3
    assert "FAIL On-Demand vCPU quota [Running On-Demand P instances]" in result.output
    assert "--desired-value 1536" in result.output
    # A failed preflight records nothing: `cdk deploy` stays refused.
    assert "recorded in" not in result.output
    assert not (tmp_path / "state").exists()


def test_preflight_cli_records_its_pass_for_cdk_deploy(preflight_cli, moto_session, tmp_path):
    import json  # noqa: PLC0415

    from nvrx_eks.infra import deploy_gate  # noqa: PLC0415
    from nvrx_eks.infra.config import ClusterConfig  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import load_model  # noqa: PLC0415

    record = tmp_path / "state" / "preflight" / "nvrx-eks.json"
    _stub_quotas(moto_session, (G_QUOTA, 128), (P_QUOTA, 1536))
    _stub_pinned_addons(moto_session, cluster_pins.DEFAULT_KUBERNETES_VERSION)
    assert preflight_cli().exit_code == 0
    data = json.loads(record.read_text())
    config = load_model(ClusterConfig, tmp_path / "cluster.yaml")
    assert data["config_digest"] == deploy_gate.config_digest(config)
    assert data["account"] == "123456789012"  # moto's account: the credentials' own, from STS


def test_a_kubernetes_version_out_of_standard_support_fails_naming_the_fix(plain_session):
    _quietly_identified(plain_session)
    stubber = _standard_support(Stubber(plain_session.client("eks")), "1.35", status="EXTENDED_SUPPORT")
    stubber.activate()
    results = Preflight(session=plain_session, target=_addon_target()).run()
    stubber.assert_no_pending_responses()
    row = _by_check(results, "Kubernetes standard support", "1.35")
    assert row.status is Status.FAIL
    assert row.detail == "Kubernetes 1.35 is EXTENDED_SUPPORT (standard support ends 2027-03-27)"
    assert "infra/cluster_pins.py" in row.fix


def test_configuration_values_the_addon_schema_refuses_fail_naming_the_field(plain_session):
    """CreateAddon validates configuration values against the version's schema: preflight does first."""
    _quietly_identified(plain_session)
    stubber = _standard_support(Stubber(plain_session.client("eks")), "1.35")
    name, version = "eks-node-monitoring-agent", "v1.7.0-eksbuild.1"
    stubber.add_response(
        "describe_addon_versions",
        _addon_page(name, [version], "1.35"),
        {"kubernetesVersion": "1.35", "addonName": name},
    )
    # A schema with nodeAgent only: the kit's dcgmAgent.tolerations would be refused.
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"nodeAgent": {"type": "object"}},
        "additionalProperties": False,
    }
    _configuration_schema(stubber, name, version, schema)
    stubber.activate()
    target = _addon_target(
        AddonTarget(name=name, version=version, configuration=MANAGED_ADDON_CONFIGURATION[name])
    )
    results = Preflight(session=plain_session, target=target).run()
    stubber.assert_no_pending_responses()
    row = _by_check(results, "add-on version", name)
    assert row.status is Status.FAIL
    assert "v1.7.0-eksbuild.1 refuses the kit's configuration values: (top level): Additional properties" in (
        row.detail
    )
    assert "'dcgmAgent' was unexpected" in row.detail
    assert "infra/addon_values.py" in row.fix


def test_preflight_cli_bad_config_exits_2(preflight_cli):
    result = preflight_cli("gpu_node_groups=[]")
    assert result.exit_code == 2
    assert "gpu_node_groups" in result.output


def test_retry_policy_is_standard_unless_the_profile_says_otherwise(make_session, tmp_path, monkeypatch):
    from nvrx_eks.infra.ops.aws import DEFAULT_MAX_ATTEMPTS, retry_config  # noqa: PLC0415

    config = retry_config(make_session().session)
    assert config.retries == {"mode": "standard", "total_max_attempts": DEFAULT_MAX_ATTEMPTS}
    profile = tmp_path / "user-config"
    profile.write_text("[default]\nretry_mode = adaptive\nmax_attempts = 3\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(profile))
    config = retry_config(make_session().session)
    assert config.retries == {"mode": "adaptive", "total_max_attempts": 3}


def test_job_capacity_counts_spares_against_the_node_groups_max_size():
    from pathlib import Path  # noqa: PLC0415

    from nvrx_eks.infra.config import ClusterConfig  # noqa: PLC0415
    from nvrx_eks.infra.ops.preflight import Status, job_capacity  # noqa: PLC0415
    from nvrx_eks.k8s.load import load_values  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import load_model  # noqa: PLC0415

    root = Path(__file__).resolve().parents[2]
    config = load_model(ClusterConfig, root / "infra/configs/default.yaml", [])
    (group,) = [g for g in config.gpu_node_groups if g.instance_type == "p5.48xlarge"] or [None]
    assert group is not None, "default.yaml has a p5.48xlarge node group"
    values_file = root / "k8s/values/p5-2.yaml"
    fits = job_capacity(config, load_values(values_file, [f"spares={group.max_size - 2}"]))
    assert fits.status == Status.PASS, fits
    over = job_capacity(config, load_values(values_file, [f"spares={group.max_size - 1}"]))
    assert over.status == Status.FAIL
    assert f"needs {group.max_size + 1} p5.48xlarge nodes" in over.detail
    assert "spares" in over.fix


# -- EKS add-on versions (describe-addon-versions: not in moto, so botocore's Stubber) --------------


def _addon_page(name: str, versions: list[str], kubernetes: str, then: str | None = None) -> dict:
    page: dict = {
        "addons": [
            {
                "addonName": name,
                "type": "networking",
                "addonVersions": [
                    {
                        "addonVersion": version,
                        "architecture": ["amd64", "arm64"],
                        "compatibilities": [{"clusterVersion": kubernetes, "defaultVersion": i == 0}],
                    }
                    for i, version in enumerate(versions)
                ],
            }
        ]
        if versions
        else []
    }
    if then:
        page["nextToken"] = then
    return page


def _standard_support(stubber: Stubber, version: str, status: str = "STANDARD_SUPPORT") -> Stubber:
    """DescribeClusterVersions' answer for `version` (the first EKS call of a run)."""
    stubber.add_response(
        "describe_cluster_versions",
        {
            "clusterVersions": [
                {
                    "clusterVersion": version,
                    "versionStatus": status,
                    "endOfStandardSupportDate": dt.datetime(2027, 3, 27, tzinfo=dt.UTC),
                }
            ]
        },
        {"clusterVersions": [version], "includeAll": True},
    )
    return stubber


def _configuration_schema(stubber: Stubber, name: str, version: str, schema: dict) -> None:
    stubber.add_response(
        "describe_addon_configuration",
        {"addonName": name, "addonVersion": version, "configurationSchema": json.dumps(schema)},
        {"addonName": name, "addonVersion": version},
    )


def _stub_pinned_addons(session, kubernetes: str, offered: dict[str, list[str]] | None = None) -> Stubber:
    """One describe-addon-versions answer per pinned add-on, in pin order: the pin itself unless
    `offered` says otherwise. (The node groups' live size rows ask CloudFormation, which holds no
    stack yet: not deployed.)"""
    stubber = _standard_support(Stubber(session.client("eks")), kubernetes)
    for pin in cluster_pins.EKS_ADDONS.values():
        versions = (offered or {}).get(pin.name, [pin.version_for(kubernetes)])
        stubber.add_response(
            "describe_addon_versions",
            _addon_page(pin.name, versions, kubernetes),
            {"kubernetesVersion": kubernetes, "addonName": pin.name},
        )
        if pin.name in MANAGED_ADDON_CONFIGURATION and pin.version_for(kubernetes) in versions:
            _configuration_schema(stubber, pin.name, pin.version_for(kubernetes), {"type": "object"})
    stubber.activate()
    return stubber


def _addon_target(*addons: AddonTarget, kubernetes: str = "1.35") -> PreflightTarget:
    return PreflightTarget(
        region="us-east-1",
        availability_zone="us-east-1a",
        node_groups=(),
        kubernetes_version=kubernetes,
        addons=addons,
    )


def _quietly_identified(session) -> None:
    sts = Stubber(session.client("sts"))
    sts.add_response(
        "get_caller_identity",
        {"Account": "123456789012", "Arn": "arn:aws:iam::123456789012:user/ops", "UserId": "AIDEXAMPLE"},
    )
    sts.activate()


def test_target_checks_every_pinned_addon_at_the_clusters_version(tmp_path):
    from nvrx_eks.infra.config import ClusterConfig  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import load_model  # noqa: PLC0415

    config_file = tmp_path / "cluster.yaml"
    config_file.write_text(CONFIG + 'kubernetes_version: "1.35"\n')
    target = target_from_config(load_model(ClusterConfig, config_file))
    assert target.kubernetes_version == "1.35"
    assert {(a.name, a.version) for a in target.addons} == {
        (pin.name, pin.version_for("1.35")) for pin in cluster_pins.EKS_ADDONS.values()
    }


def test_an_addon_version_eks_does_not_offer_fails_listing_the_valid_ones(plain_session):
    _quietly_identified(plain_session)
    stubber = _standard_support(Stubber(plain_session.client("eks")), "1.35")
    # Two pages: the paginator follows nextToken, and every version of both pages is listed.
    stubber.add_response(
        "describe_addon_versions",
        _addon_page("vpc-cni", ["v1.21.1-eksbuild.3", "v1.21.0-eksbuild.4"], "1.35", then="t1"),
        {"kubernetesVersion": "1.35", "addonName": "vpc-cni"},
    )
    stubber.add_response(
        "describe_addon_versions",
        _addon_page("vpc-cni", ["v1.20.4-eksbuild.1"], "1.35"),
        {"kubernetesVersion": "1.35", "addonName": "vpc-cni", "nextToken": "t1"},
    )
    stubber.activate()
    results = Preflight(
        session=plain_session, target=_addon_target(AddonTarget(name="vpc-cni", version="v1.19.0-eksbuild.1"))
    ).run()
    stubber.assert_no_pending_responses()
    row = _by_check(results, "add-on version", "vpc-cni")
    assert row.status is Status.FAIL
    assert "v1.19.0-eksbuild.1 is not offered for Kubernetes 1.35" in row.detail
    assert "valid: v1.21.1-eksbuild.3, v1.21.0-eksbuild.4, v1.20.4-eksbuild.1" in row.detail
    assert "infra/cluster_pins.py" in row.fix


def test_an_offered_pin_passes_and_an_unknown_addon_fails(plain_session):
    _quietly_identified(plain_session)
    stubber = _standard_support(Stubber(plain_session.client("eks")), "1.35")
    stubber.add_response(
        "describe_addon_versions",
        _addon_page("coredns", ["v1.13.2-eksbuild.1"], "1.35"),
        {"kubernetesVersion": "1.35", "addonName": "coredns"},
    )
    stubber.add_response(
        "describe_addon_versions",
        _addon_page("nope", [], "1.35"),
        {"kubernetesVersion": "1.35", "addonName": "nope"},
    )
    stubber.activate()
    results = Preflight(
        session=plain_session,
        target=_addon_target(
            AddonTarget(name="coredns", version="v1.13.2-eksbuild.1"), AddonTarget(name="nope", version="v1")
        ),
    ).run()
    assert _by_check(results, "add-on version", "coredns").status is Status.PASS
    missing = _by_check(results, "add-on version", "nope")
    assert missing.status is Status.FAIL
    assert "EKS offers no nope version for Kubernetes 1.35" in missing.detail


def test_addon_access_denied_is_that_rows_failure(plain_session):
    _quietly_identified(plain_session)
    stubber = _standard_support(Stubber(plain_session.client("eks")), "1.35")
    stubber.add_client_error(
        "describe_addon_versions", service_error_code="AccessDeniedException", http_status_code=403
    )
    stubber.activate()
    results = Preflight(
        session=plain_session, target=_addon_target(AddonTarget(name="vpc-cni", version="v1"))
    ).run()
    row = _by_check(results, "add-on version", "vpc-cni")
    assert row.status is Status.FAIL
    assert "eks:DescribeAddonVersions" in row.detail


# -- Every image the stack deploys, by digest (offline). -----------------------------------------------


def _config(tmp_path, *overrides: str):
    from nvrx_eks.infra.config import ClusterConfig  # noqa: PLC0415
    from nvrx_eks.kitcore.configio import load_model  # noqa: PLC0415

    config_file = tmp_path / "cluster.yaml"
    config_file.write_text(CONFIG)
    return load_model(ClusterConfig, config_file, list(overrides))


def _image_rows(tmp_path, *overrides: str) -> dict:
    return {r.subject: r for r in map(image_digest, image_targets(_config(tmp_path, *overrides)))}


def test_a_chart_image_pulled_by_tag_fails_naming_image_pin_and_one_by_digest_passes(tmp_path, monkeypatch):
    _with_chart_digests(monkeypatch, unpublished=("dcgm-exporter",))
    rows = _image_rows(tmp_path)
    for name, chart in cluster_pins.HELM_CHARTS.items():
        for image in chart.images:
            row = rows[f"{name}: {image.values_key}"]
            assert row.check == IMAGE_CHECK
            if name == "dcgm-exporter":
                assert (row.status, row.detail) == (
                    Status.FAIL,
                    f"{image.repository}:{image.tag} is pulled by tag",
                )
                assert "nvrx-eks image pin" in row.fix
            else:
                assert (row.status, row.detail) == (
                    Status.PASS,
                    f"{image.repository}:{image.tag}@{image.digest}",
                )


def test_the_node_check_by_tag_warns_and_by_digest_passes(tmp_path, monkeypatch):
    _with_chart_digests(monkeypatch)
    by_tag = _image_rows(tmp_path, "node_check.image_tag=abc1234")["node check"]
    assert (by_tag.status, by_tag.detail) == (Status.WARN, "<ImageRepositoryUri>:abc1234 is pulled by tag")
    assert "node_check.image_digest" in by_tag.fix
    digest = f"sha256:{hashlib.sha256(b'abc1234').hexdigest()}"
    by_digest = _image_rows(tmp_path, "node_check.image_tag=abc1234", f"node_check.image_digest={digest}")
    assert by_digest["node check"].status is Status.PASS
    assert by_digest["node check"].detail == f"<ImageRepositoryUri>:abc1234@{digest}"


def test_preflight_cli_fails_on_a_chart_image_by_tag_and_records_nothing(
    preflight_cli, moto_session, tmp_path, monkeypatch
):
    _stub_quotas(moto_session, (G_QUOTA, 128), (P_QUOTA, 1536))
    _stub_pinned_addons(moto_session, cluster_pins.DEFAULT_KUBERNETES_VERSION)
    _with_chart_digests(monkeypatch, unpublished=("aws-efa-k8s-device-plugin",))
    result = preflight_cli()
    assert result.exit_code == 3
    (image,) = cluster_pins.HELM_CHARTS["aws-efa-k8s-device-plugin"].images
    assert f"FAIL {IMAGE_CHECK} [aws-efa-k8s-device-plugin: image]: {image.reference} is pulled by tag" in (
        result.output
    )
    assert "nvrx-eks image pin" in result.output
    assert not (tmp_path / "state").exists()


def test_offline_checks_fail_first_without_asking_for_credentials(preflight_cli, monkeypatch, tmp_path):
    """A job that cannot fit is reported from the two files alone: no AWS call, so no credentials."""
    from nvrx_eks.infra.ops import commands  # noqa: PLC0415

    def no_aws(profile, region):
        raise AssertionError("preflight asked AWS before its offline checks failed")

    monkeypatch.setattr(commands, "_session", no_aws)
    values = tmp_path / "job.yaml"
    values.write_text(
        (ROOT / "k8s" / "values" / "p5-2.yaml").read_text().replace("num_nodes: 2", "num_nodes: 8\nspares: 1")
    )
    result = preflight_cli("--job-values", str(values))
    assert result.exit_code == 3, result.output
    assert "FAIL job capacity [llama-8b-p5-2: 8 nodes + 1 spares]: needs 9 p5.48xlarge nodes" in (
        " ".join(result.output.split())
    )
    assert "credentials" not in result.output


def _deployed(session, *, template: tuple[int, int, int], live: tuple[int, int, int] | None) -> dict:
    """The stack as CloudFormation deployed it (its node group's min/max/desired in the template) and
    the node group as it runs (scaled by hand since, perhaps)."""
    low, high, want = template
    # What GetTemplate answers (moto cannot deploy an EKS node group from a template).
    deployed = {
        "Resources": {
            "Nodegroup": {
                "Type": "AWS::EKS::Nodegroup",
                "Properties": {
                    "NodegroupName": "p5",
                    "ScalingConfig": {"MinSize": low, "MaxSize": high, "DesiredSize": want},
                },
            }
        }
    }
    if live is not None:
        low, high, want = live
        eks = session.client("eks")
        eks.create_cluster(
            name="nvrx-eks", roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={}
        )
        eks.create_nodegroup(
            clusterName="nvrx-eks",
            nodegroupName="p5",
            nodeRole="arn:aws:iam::123456789012:role/node",
            subnets=["subnet-1"],
            scalingConfig={"minSize": low, "maxSize": high, "desiredSize": want},
        )
    return deployed


def _live_row(session, deployed: dict | None = None, **group):
    target = dataclasses.replace(
        _target(NodeGroupTarget(name="p5", instance_type="p5.48xlarge", **group)),
        cluster_name="nvrx-eks",
        stack_name="nvrx-eks",
    )
    cfn = session.client("cloudformation")
    if deployed is not None:
        stubber = Stubber(cfn)
        stubber.add_response(
            "get_template",
            {"TemplateBody": json.dumps(deployed)},
            {"StackName": "nvrx-eks", "TemplateStage": "Original"},
        )
        with stubber:
            return Preflight(session=session, target=target)._live_size(target.node_groups[0])
    return Preflight(session=session, target=target)._live_size(target.node_groups[0])


def test_a_deploy_that_would_shrink_a_group_running_a_job_fails(moto_session):
    # Deployed at 0/2/0, scaled by hand to 2 for a job; the config raises max to 4 and keeps desired 0:
    # CloudFormation writes min 0 / max 4 / desired 0 and takes both nodes away.
    deployed = _deployed(moto_session, template=(0, 2, 0), live=(0, 2, 2))
    row = _live_row(moto_session, deployed, min_nodes=0, max_nodes=4, desired_nodes=0)
    assert row.status is Status.FAIL
    assert row.detail == (
        "runs 2 nodes; the deploy changes the template's min/max/desired (0/2/0 -> 0/4/0) and so writes "
        "desired size 0, removing 2"
    )
    assert "(0/2/0)" in row.fix
    # The template's scaling as deployed: CloudFormation leaves the group alone.
    assert _live_row(moto_session, deployed, min_nodes=0, max_nodes=2, desired_nodes=0).status is Status.PASS
    # A desired size that keeps the running nodes passes too.
    assert _live_row(moto_session, deployed, min_nodes=0, max_nodes=4, desired_nodes=2).status is Status.PASS


def test_a_hand_edit_recorded_in_the_config_is_a_template_change(moto_session):
    """Scaled by hand to min 0 / max 2 / desired 2 and the config edited to max 2 to match: the live
    bounds equal the config's, yet the template's change from max 1 still writes desired 0 (a check of
    live min/max against the config passed this)."""
    deployed = _deployed(moto_session, template=(0, 1, 0), live=(0, 2, 2))
    row = _live_row(moto_session, deployed, min_nodes=0, max_nodes=2, desired_nodes=0)
    assert row.status is Status.FAIL
    assert "removing 2" in row.detail


def test_a_hand_edit_the_config_does_not_record_leaves_the_deploy_alone(moto_session):
    """Scaled by hand to 0/2/2 and the config left as deployed (0/1/0): the template does not change, so
    CloudFormation does not touch the group (a check of live min/max against the config refused this)."""
    deployed = _deployed(moto_session, template=(0, 1, 0), live=(0, 2, 2))
    row = _live_row(moto_session, deployed, min_nodes=0, max_nodes=1, desired_nodes=0)
    assert row.status is Status.PASS
    assert "unchanged" in row.detail


def test_a_group_not_deployed_yet_passes(moto_session):
    row = _live_row(moto_session, min_nodes=0, max_nodes=2, desired_nodes=0)
    assert (row.status, row.detail) == (Status.PASS, "not deployed yet")
