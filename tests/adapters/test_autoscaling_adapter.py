"""The Auto Scaling adapter's lookups, held to the API's model by botocore's Stubber:
DescribeAutoScalingInstances takes at most 50 ids a call, and with none it would list every
group instance of the account, so no ids means no call."""

from __future__ import annotations

import boto3
from botocore.stub import Stubber

from gpu_recovery.adapters.autoscaling import AutoScalingReplacer


def _client() -> object:
    return boto3.client("autoscaling", region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def _answer(ids: list[str]) -> dict[str, object]:
    return {"AutoScalingInstances": [
        {"InstanceId": i, "AutoScalingGroupName": "gpu-nodes", "AvailabilityZone": "us-east-1a",
         "LifecycleState": "InService", "HealthStatus": "HEALTHY", "ProtectedFromScaleIn": False}
        for i in ids]}


def test_no_ids_make_no_call() -> None:
    client = _client()
    with Stubber(client) as stub:  # any call would fail: nothing is queued
        assert AutoScalingReplacer(client).groups_of([]) == {}
        stub.assert_no_pending_responses()


def test_more_than_fifty_ids_are_looked_up_fifty_a_call() -> None:
    client = _client()
    ids = [f"i-{n:017x}" for n in range(120)]
    with Stubber(client) as stub:
        for start in (0, 50, 100):
            chunk = ids[start:start + 50]
            stub.add_response("describe_auto_scaling_instances", _answer(chunk), {"InstanceIds": chunk})
        found = AutoScalingReplacer(client).groups_of(ids)
        stub.assert_no_pending_responses()
    assert found == {i: ("InService", "gpu-nodes") for i in ids}
