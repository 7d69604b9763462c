"""Deployed rule patterns vs. AWS-documented sample events (moto's EventBridge matcher on the
event with its arrays of objects crushed as EventBridge does: ``local_mode.sim.bus``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from infra_synth import CLUSTER_ARN, Synth

from local_mode.sim.bus import pattern_matches
from tests.fixtures.events import load_event

OTHER_CLUSTER_ARN = "arn:aws:ecs:us-east-1:111122223333:cluster/other-cluster"


def _rules_by_handler(synth: Synth) -> dict[str, list[dict[str, Any]]]:
    """The synthesized patterns of the event rules, keyed by their target's handler (the
    instance monitor has three: its own, and AWS's notices: tests/infra/test_aws_notice_patterns.py)."""
    functions = synth.resources("AWS::Lambda::Function")
    out: dict[str, list[dict[str, Any]]] = {}
    for rule in synth.resources("AWS::Events::Rule").values():
        if "EventPattern" not in rule["Properties"]:
            continue
        (target,) = rule["Properties"]["Targets"]
        handler = functions[target["Arn"]["Fn::GetAtt"][0]]["Properties"]["Handler"]
        out.setdefault(handler.split(".")[1], []).append(rule["Properties"]["EventPattern"])
    return out


def _matching_rules(synth: Synth, event: dict[str, Any]) -> set[str]:
    return {
        name
        for name, patterns in _rules_by_handler(synth).items()
        if any(pattern_matches(pattern, event) for pattern in patterns)
    }


def _in_cluster(event: dict[str, Any], cluster_arn: str = CLUSTER_ARN) -> dict[str, Any]:
    event = copy.deepcopy(event)
    event["detail"]["clusterArn"] = cluster_arn
    return event


def test_documented_task_event_goes_to_the_task_handler_only(default_synth: Synth) -> None:
    """Given the ECS guide's task state change (rewritten to our cluster),
    When matched against the deployed rules, Then only the training-task rule matches."""
    event = _in_cluster(load_event("aws_doc_ecs_task_state_change.json"))
    assert _matching_rules(default_synth, event) == {"ecs_task_handler"}


def test_training_task_stopped_goes_to_the_task_handler_only(default_synth: Synth) -> None:
    """Given a training rank stopped with exit code 1, Then only the task handler gets it."""
    event = load_event("training_task_stopped_exit1.json")
    assert event["detail"]["clusterArn"] == CLUSTER_ARN
    assert _matching_rules(default_synth, event) == {"ecs_task_handler"}


def test_health_check_stopped_goes_to_the_dcgm_monitor_only(default_synth: Synth) -> None:
    """Given the health-check task stopped (group gpu-recovery-health-check, exit 1),
    Then only the DCGM monitor rule matches (never the training-task rule)."""
    event = _in_cluster(load_event("health_check_task_stopped.json"))
    assert _matching_rules(default_synth, event) == {"dcgm_task_monitor"}


def test_running_health_check_matches_no_rule(default_synth: Synth) -> None:
    """Given the health-check task still RUNNING, Then neither task rule matches."""
    event = _in_cluster(load_event("health_check_task_stopped.json"))
    event["detail"]["lastStatus"] = "RUNNING"
    assert _matching_rules(default_synth, event) == set()


def test_a_container_instance_event_of_a_node_not_rebooting_invokes_nothing(default_synth: Synth) -> None:
    """Given the ECS guide's container instance state change (our cluster): a node's
    resources changed, as on every task start and stop (issue 40, defect 10),
    Then no rule matches: the instance monitor acts only on nodes the stack reboots."""
    event = _in_cluster(load_event("aws_doc_ecs_container_instance_state_change.json"))
    assert _matching_rules(default_synth, event) == set()


@pytest.mark.parametrize("fixture", ["ecs_container_instance_rebooting_disconnected.json",
                                     "ecs_container_instance_agent_updated_while_rebooting.json"])
def test_a_rebooting_node_s_events_go_to_the_instance_monitor_only(default_synth: Synth,
                                                                   fixture: str) -> None:
    """Given the ECS guide's container instance event of a node carrying the custom attribute
    ``gpu-recovery.rebooting`` among the agent's (an array of objects: any element's name
    matches), disconnected or reconnected after an agent update, Then only the
    container-instance rule matches."""
    event = _in_cluster(load_event(fixture))
    assert _matching_rules(default_synth, event) == {"ecs_instance_monitor"}


def test_the_rebooting_attribute_must_be_an_attribute_name_not_a_value(default_synth: Synth) -> None:
    """Given a node whose *value* of another attribute is "gpu-recovery.rebooting", Then
    nothing matches: the pattern is on the name of one element."""
    event = _in_cluster(load_event("aws_doc_ecs_container_instance_state_change.json"))
    event["detail"]["attributes"].append({"name": "team", "value": "gpu-recovery.rebooting"})
    assert _matching_rules(default_synth, event) == set()


@pytest.mark.parametrize(
    "fixture",
    [
        "aws_doc_ecs_task_state_change.json",
        "aws_doc_ecs_container_instance_state_change.json",
        "ecs_container_instance_rebooting_disconnected.json",
        "health_check_task_stopped.json",
        "training_task_stopped_exit1.json",
    ],
)
def test_events_from_another_cluster_match_nothing(default_synth: Synth, fixture: str) -> None:
    """Given any event from another cluster (or the documented default cluster),
    Then no rule of this stack matches it."""
    assert _matching_rules(default_synth, _in_cluster(load_event(fixture), OTHER_CLUSTER_ARN)) == set()
    if fixture.startswith("aws_doc"):
        assert _matching_rules(default_synth, load_event(fixture)) == set()
