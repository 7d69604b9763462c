"""Issue 49 (why 7): ``allowed_task_networks``, validated at synth by the jobs API's own
parser and given to the jobs API function as its environment."""

from __future__ import annotations

import json

import pytest

from gpu_recovery.constants import ENV_JOBS_ALLOWED_NETWORKS
from gpu_recovery.settings import access_policy
from infra.config import ConfigError, RecoveryConfig
from infra.stack import jobs_access_environment

GRANTS = [{"subnets": ["subnet-0a1b2c3d"], "security_groups": ["sg-0a1b2c3d"]},
          {"subnets": ["*"], "security_groups": ["sg-0e1f2a3b"], "principals": ["ml-team"]}]


@pytest.mark.parametrize("value", [GRANTS, json.dumps(GRANTS)])
def test_the_allow_list_reaches_the_jobs_api_as_its_access_policy(value: object) -> None:
    config = RecoveryConfig.from_context({"cluster_name": "c", "allowed_task_networks": value})
    env = jobs_access_environment(config)
    policy = access_policy(env)
    assert [g.security_groups for g in policy.allowed_networks] == [("sg-0a1b2c3d",), ("sg-0e1f2a3b",)]
    assert policy.allowed_networks[1].principals == ("ml-team",)
    assert json.loads(env[ENV_JOBS_ALLOWED_NETWORKS]) == json.loads(json.dumps(GRANTS, sort_keys=True))


def test_by_default_no_network_is_allowed() -> None:
    env = jobs_access_environment(RecoveryConfig.from_context({"cluster_name": "c"}))
    assert access_policy(env).allowed_networks == ()


@pytest.mark.parametrize(("value", "says"), [
    ('[{"subnets": ["subnet-xyz"]}]', "not a valid subnet id"),
    ('{"subnets": ["subnet-0a1b2c3d"]}', "list of grants"),
    ('[{"subnets": ["subnet-0a1b2c3d"], "principals": ["bad name!"]}]', "not a valid IAM role"),
])
def test_a_bad_allow_list_fails_synthesis_naming_the_key(value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"allowed_task_networks.*{says}"):
        RecoveryConfig.from_context({"cluster_name": "c", "allowed_task_networks": value})
