"""An awsvpc task's network (``domain.task_network``), without any emulator."""

from __future__ import annotations

import pytest

from gpu_recovery.domain.task_network import (
    NetworkError,
    awsvpc_configuration,
    eni_subnet,
    id_list,
    restart_network,
)
from tests.fixtures.events import load_event

SUBNET_A, SUBNET_B = "subnet-0a1b2c3d4e5f60718", "subnet-abcd1234"
GROUP = "sg-0123456789abcdef0"


def test_the_subnet_of_a_task_s_network_interface_is_read_from_its_event_and_its_description() -> None:
    """The ECS guide's task state change (awsvpc: an "eni" attachment) names its subnet;
    DescribeTasks calls the same attachment "ElasticNetworkInterface"; a task without one
    (bridge or host mode) has none."""
    detail = load_event("aws_doc_ecs_task_state_change.json")["detail"]
    assert eni_subnet(detail) == "subnet-abcd1234"
    described = {"attachments": [{**detail["attachments"][0], "type": "ElasticNetworkInterface"}]}
    assert eni_subnet(described) == "subnet-abcd1234"
    assert eni_subnet({"attachments": []}) == eni_subnet({}) == ""


def test_ids_of_a_tag_are_space_separated() -> None:
    """An ECS tag value allows no comma: ids are separated by spaces (commas, too, where an
    environment variable carries them)."""
    assert id_list(f"{GROUP}  sg-0123456789abcdef1") == [GROUP, "sg-0123456789abcdef1"]
    assert id_list(f"{SUBNET_A},{SUBNET_B}") == [SUBNET_A, SUBNET_B]
    assert id_list("") == id_list(None) == []


@pytest.mark.parametrize(("subnets", "groups", "why"), [
    ([], [GROUP], "at least one subnet"),
    ([f"subnet-{i:08x}" for i in range(17)], [GROUP], "at most 16"),
    ([SUBNET_A], [f"sg-{i:08x}" for i in range(6)], "at most 5"),
    (["subnet-xyz"], [GROUP], "not a subnet or security group id: subnet-xyz"),
    ([SUBNET_A], ["default"], "not a subnet or security group id: default"),
])
def test_a_configuration_ecs_would_refuse_is_refused_first(subnets: list[str], groups: list[str],
                                                             why: str) -> None:
    with pytest.raises(NetworkError, match=why):
        awsvpc_configuration(subnets, groups)


def test_a_valid_configuration_never_asks_for_a_public_ip() -> None:
    assert awsvpc_configuration([SUBNET_A, SUBNET_A], [GROUP]) == {
        "subnets": [SUBNET_A], "securityGroups": [GROUP], "assignPublicIp": "DISABLED"}


def test_a_restart_gives_the_ranks_own_subnets_first_then_the_job_s() -> None:
    job = awsvpc_configuration([SUBNET_A], [GROUP])
    assert restart_network(job, [SUBNET_B, "", SUBNET_B]) == {"awsvpcConfiguration": {
        "subnets": [SUBNET_B, SUBNET_A], "securityGroups": [GROUP], "assignPublicIp": "DISABLED"}}
    assert restart_network({}, ["", ""]) is None  # not in the awsvpc mode: nothing to give
