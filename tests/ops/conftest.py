from __future__ import annotations

import boto3
import botocore.loaders
import botocore.session
import pytest
from moto import mock_aws

from nvrx_eks.infra.ops.aws import AwsSession

REGION = "us-east-1"
# One botocore data loader for the whole run: it caches the parsed service models (EC2's is large),
# so each test's fresh session does not parse them again.
_LOADER = botocore.loaders.create_loader()


def new_session(region: str = REGION) -> AwsSession:
    """A fresh session from the standard chain (the test's env vars), sharing the model cache."""
    core = botocore.session.Session()
    core.register_component("data_loader", _LOADER)
    return AwsSession(session=boto3.Session(botocore_session=core, region_name=region))


@pytest.fixture
def aws_env(aws_credentials, monkeypatch):
    """The fake credentials in REGION, with botocore's default retry settings."""
    for var in ("AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)


@pytest.fixture
def moto_session(aws_env):
    with mock_aws():
        yield new_session()


@pytest.fixture
def plain_session(aws_env):
    """A session with fake credentials and no mock behind it: for clients wrapped in a Stubber."""
    return new_session()


@pytest.fixture
def make_session(aws_env):
    """Factory for sessions created inside a test (after it changed the environment)."""
    return new_session


def published_pins(url: str, headers) -> object:
    """Helm repositories that publish every pinned chart version (no test reaches the network)."""
    import yaml  # noqa: PLC0415

    from nvrx_eks.infra import cluster_pins  # noqa: PLC0415
    from nvrx_eks.infra.ops.charts import Answer  # noqa: PLC0415

    for pin in cluster_pins.HELM_CHARTS.values():
        if url == f"{pin.repository.rstrip('/')}/index.yaml":
            index = {
                "apiVersion": "v1",
                "entries": {pin.chart: [{"name": pin.chart, "version": pin.version}]},
            }
            return Answer(200, yaml.safe_dump(index).encode())
        host, _, path = pin.repository.removeprefix("oci://").partition("/")
        if url == f"https://{host}/v2/{path}/manifests/{pin.version}":
            return Answer(200, b"{}")
    return Answer(404)


@pytest.fixture(autouse=True)
def _charts_published(monkeypatch):
    from nvrx_eks.infra.ops import charts  # noqa: PLC0415

    monkeypatch.setattr(charts, "http_get", published_pins)
