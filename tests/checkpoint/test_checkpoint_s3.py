"""The durable tier on S3 (moto): commit protocol, verification and retention."""

from __future__ import annotations

import boto3
import pytest
import torch
from moto import mock_aws

from nvrx_eks.training.checkpoint.shard import ShardError, to_bytes
from nvrx_eks.training.checkpoint.storage import S3Store


@pytest.fixture
def store():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="ckpt")
        yield S3Store(tier="durable", url="s3://ckpt/runs/a", client=client)


def test_s3_commit_read_verify_and_prune(store):
    for step in (10, 20, 30):
        store.commit(step=step, rank=1, world_size=2, chunks=[to_bytes({"w": torch.full((4,), float(step))})])
    assert sorted(store.manifests(1)) == [10, 20, 30]
    assert torch.equal(store.read(20, 1)["w"], torch.full((4,), 20.0))
    assert store.prune(rank=1, keep=2) == [10]
    assert sorted(store.manifests()) == [20, 30]
    # A shard replaced behind its manifest's back is detected, not loaded.
    key = "runs/a/step-000000030/rank-00001.shard"
    blob = bytearray(store.client.get_object(Bucket="ckpt", Key=key)["Body"].read())
    blob[-1] ^= 1
    store.client.put_object(Bucket="ckpt", Key=key, Body=bytes(blob))
    with pytest.raises(ShardError, match="CRC32"):
        store.read(30, 1)
