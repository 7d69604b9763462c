"""The stage worlds' DynamoDB (tests/recovery/fakes.py): the in-memory store behind every
client boto3's default session makes inside a world, moto's again once it is left."""

from __future__ import annotations

import boto3
from moto import mock_aws

from local_mode.sim.dynamo.botocore_backend import StoreTransport
from tests.recovery import fakes


def test_a_world_serves_its_repository_and_the_tests_own_clients_from_one_store() -> None:
    with fakes.world():
        client = boto3.client("dynamodb", region_name=fakes.REGION)
        assert isinstance(client._make_api_call, StoreTransport)
        # the table the world made through its repository's resource: the same store
        assert client.describe_table(TableName="jobs")["Table"]["TableName"] == "jobs"


def _served(client: object) -> bool:
    return isinstance(client._make_api_call, StoreTransport)  # type: ignore[attr-defined]


def test_the_session_is_given_back_once_the_world_is_left() -> None:
    # One mock_aws around it all: its default session outlives the store's (a world's own
    # mock_aws would hand back a fresh session whatever the store left on the old one).
    with mock_aws():
        session = boto3._get_default_session()
        with fakes.dynamodb_of_the_world():
            assert _served(boto3.client("dynamodb", region_name=fakes.REGION))
        assert boto3._get_default_session() is session
        assert "client" not in vars(session) and "resource" not in vars(session)
        assert not _served(boto3.client("dynamodb", region_name=fakes.REGION))
