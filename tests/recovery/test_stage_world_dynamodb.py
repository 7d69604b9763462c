"""The stage worlds' DynamoDB (tests/recovery/fakes.py): the in-memory store behind every
client boto3's default session makes inside a world, moto's again once it is left."""

from __future__ import annotations

import boto3
from moto import mock_aws

from local_mode.sim.dynamo.botocore_backend import StoreTransport
from tests.recovery import fakes


def test_a_world_serves_its_repository_and_the_tests_own_clients_from_one_store_and_gives_them_back() -> None:
    with fakes.world():
        client = boto3.client("dynamodb", region_name=fakes.REGION)
        assert isinstance(client._make_api_call, StoreTransport)
        # the table the world made through its repository's resource: the same store
        assert client.describe_table(TableName="jobs")["Table"]["TableName"] == "jobs"
    assert "client" not in vars(boto3._get_default_session())
    with mock_aws():
        moto_client = boto3.client("dynamodb", region_name=fakes.REGION)
        assert not isinstance(moto_client._make_api_call, StoreTransport)
