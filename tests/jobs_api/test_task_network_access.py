"""Issue 49 (why 7): a job's ``network`` (the subnets and security groups the launcher's role
starts its tasks in) only from the deployment's allow-list (``allowed_task_networks``,
optionally per principal): anything else is a 403 naming the value, with nothing written,
started or woken. A job that names no network is unaffected."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from gpu_recovery.constants import ENV_JOBS_ALLOWED_NETWORKS
from gpu_recovery.queue.access import parse_allowed_networks
from handlers import jobs_api
from tests.jobs_api.api_harness import ALICE, BOB, REGION, Api, valid_spec

TEAM_SESSION = "arn:aws:sts::111122223333:assumed-role/ml-team/carol"


def _vpc() -> dict[str, str]:
    ec2 = boto3.client("ec2", region_name=REGION)
    subnet = ec2.describe_subnets()["Subnets"][0]
    groups = {name: ec2.create_security_group(GroupName=name, Description=name,
                                              VpcId=subnet["VpcId"])["GroupId"]
              for name in ("training", "prod-db-admin", "team-only")}
    return {"subnet": subnet["SubnetId"], **groups}


def _vpc_task_definition() -> None:
    boto3.client("ecs", region_name=REGION).register_task_definition(
        family="llama-vpc", networkMode="awsvpc",
        containerDefinitions=[{"name": "trainer", "image": "llm-train:latest", "memory": 1024,
                               "resourceRequirements": [{"type": "GPU", "value": "8"}]}])


def _allow(monkeypatch: pytest.MonkeyPatch, grants: list[dict[str, Any]]) -> None:
    monkeypatch.setenv(ENV_JOBS_ALLOWED_NETWORKS, json.dumps(grants))
    jobs_api.reset()  # the service reads its settings once


def _spec(subnet: str, *groups: str) -> dict[str, Any]:
    return valid_spec(task_definition="llama-vpc:1",
                      network={"subnets": [subnet], "security_groups": list(groups)})


def _nothing_done(api: Api) -> None:
    items = api.job_table.scan()["Items"]
    assert [i for i in items if i.get("item_type") == "JOB"] == []
    assert api.triggers == []
    assert boto3.client("ecs", region_name=REGION).list_tasks(cluster="gpu-cluster")["taskArns"] == []


def test_a_security_group_outside_the_allow_list_is_403_naming_it_and_nothing_is_done(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    vpc = _vpc()
    _vpc_task_definition()
    _allow(monkeypatch, [{"subnets": [vpc["subnet"]], "security_groups": [vpc["training"]]}])
    status, body = api.submit(_spec(vpc["subnet"], vpc["training"], vpc["prod-db-admin"]), user_arn=ALICE)
    assert status == 403, body
    assert body["error"] == "forbidden:task_network" and body["field"] == "network"
    assert vpc["prod-db-admin"] in body["message"] and vpc["training"] in body["message"]
    _nothing_done(api)
    status, body = api.submit(_spec("subnet-0123456789abcdef0", vpc["training"]), user_arn=ALICE)
    assert status == 403 and "subnet-0123456789abcdef0" in body["message"], body
    _nothing_done(api)
    # The allowed network runs: the job item keeps it for every StartTask.
    status, body = api.submit(_spec(vpc["subnet"], vpc["training"]), user_arn=ALICE)
    assert status == 201, body
    item = api.job_table.get_item(Key={"job_id_rank": f"{body['job_id']}#JOB"})["Item"]
    assert item["network"]["securityGroups"] == [vpc["training"]]


def test_without_an_allow_list_no_network_may_be_named_and_the_403_says_how_to_allow_one(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    vpc = _vpc()
    _vpc_task_definition()
    monkeypatch.delenv(ENV_JOBS_ALLOWED_NETWORKS, raising=False)
    jobs_api.reset()
    status, body = api.submit(_spec(vpc["subnet"], vpc["prod-db-admin"]), user_arn=ALICE)
    assert status == 403 and body["error"] == "forbidden:task_network", body
    assert "allowed_task_networks" in body["message"] and vpc["prod-db-admin"] in body["message"]
    _nothing_done(api)
    assert api.submit(valid_spec(), user_arn=ALICE)[0] == 201  # no network: unaffected


def test_a_grant_for_a_principal_applies_to_it_only_and_no_group_means_the_default_group(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    vpc = _vpc()
    _vpc_task_definition()
    _allow(monkeypatch, [{"subnets": [vpc["subnet"]], "security_groups": [vpc["training"]]},
                         {"subnets": [vpc["subnet"]], "security_groups": [vpc["team-only"]],
                          "principals": ["ml-team"]}])
    status, body = api.submit(_spec(vpc["subnet"], vpc["team-only"]), user_arn=BOB)
    assert status == 403 and vpc["team-only"] in body["message"], body
    assert api.submit(_spec(vpc["subnet"], vpc["team-only"]), user_arn=TEAM_SESSION)[0] == 201
    status, body = api.submit(_spec(vpc["subnet"]), user_arn=BOB)
    assert status == 403 and "default group" in body["message"], body


@pytest.mark.parametrize(("text", "says"), [
    ('{"subnets": []}', "list of grants"),
    ('[{"subnets": ["subnet-1"]}]', "not a valid subnet id"),
    ('[{"security_groups": ["sg-0123456789abcdef0"], "vpc": "x"}]', "unknown field"),
    ('[{"principals": ["ml-team"]}]', "no subnet and no security group"),
])
def test_a_malformed_allow_list_is_refused_with_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_allowed_networks(text)
