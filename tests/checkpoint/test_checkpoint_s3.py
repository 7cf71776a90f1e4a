"""The durable tier on S3 (moto): commit protocol, verification and retention."""

from __future__ import annotations

import boto3
import pytest
import torch
from botocore.exceptions import ClientError
from moto import mock_aws

from nvrx_eks.training.checkpoint.config import CheckpointConfig
from nvrx_eks.training.checkpoint.dcp_format import Stager
from nvrx_eks.training.checkpoint.factory import probe_checkpointer
from nvrx_eks.training.checkpoint.probe import failed
from nvrx_eks.training.checkpoint.restore import load_part
from nvrx_eks.training.checkpoint.shard import ShardError
from nvrx_eks.training.checkpoint.storage import S3Store


@pytest.fixture
def store():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="ckpt")
        yield S3Store(tier="durable", url="s3://ckpt/runs/a", client=client)


def test_s3_commit_read_verify_finalize_and_prune(store):
    stagers = {rank: Stager(rank=rank, world_size=2) for rank in (0, 1)}
    for step in (10, 20, 30):
        for rank in (0, 1):
            staged = stagers[rank].stage({"w": torch.full((4,), float(step + rank))})
            store.commit(step=step, rank=rank, world_size=2, staged=staged)
    assert sorted(store.manifests(1)) == [10, 20, 30]
    assert torch.equal(load_part(store, 20, 1)["w"], torch.full((4,), 21.0))
    # Every rank's part is there: the global metadata makes it a checkpoint DCP reads at any size.
    assert store.finalize(20, 2)
    assert store.has_file(20, ".metadata")
    assert store.prune(rank=1, keep=2) == [10]
    assert store.prune(rank=0, keep=2) == [10]
    assert sorted(store.manifests()) == [20, 30]
    # A data file replaced behind its manifest's back is detected, not loaded.
    key = "runs/a/step-000000030/__1_0.distcp"
    blob = bytearray(store.client.get_object(Bucket="ckpt", Key=key)["Body"].read())
    blob[-1] ^= 1
    store.client.put_object(Bucket="ckpt", Key=key, Body=bytes(blob))
    with pytest.raises(ShardError, match="CRC32"):
        load_part(store, 30, 1)


def test_the_probe_lists_writes_and_removes_and_names_a_missing_bucket(store):
    assert store.probe() == "listed, written and deleted (region us-east-1)"
    assert store.client.list_objects_v2(Bucket="ckpt").get("KeyCount") == 0
    missing = S3Store(tier="durable", url="s3://nope/runs/a", client=store.client)
    with pytest.raises(ClientError) as caught:
        missing.probe()
    probe = failed("durable", missing.location, caught.value)
    assert "NoSuchBucket" in probe.detail
    assert probe.detail.endswith("; create the bucket, or correct checkpoint.durable_dir")


def test_a_durable_tier_on_s3_is_probed_with_the_client_the_checkpointer_opens(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    config = CheckpointConfig(implementation="sync", durable_dir="s3://ckpt/runs/a", durable_every=4)
    with mock_aws():
        (probe,) = probe_checkpointer(config)
        assert (probe.tier, probe.ok, probe.location) == ("durable", False, "s3://ckpt/runs/a")
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="ckpt")
        (probe,) = probe_checkpointer(config)
        assert probe.ok, probe
