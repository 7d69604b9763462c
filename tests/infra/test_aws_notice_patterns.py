"""AWS's notices (docs/aws-notices.md): each deployed rule matches its documented sample events
(tests/events/aws_doc_ec2_*, aws_doc_health_*, their source pages in tests/events/README.md) and
nothing else the stack sees; the stack's other rules match none of the notices. The patterns are
``local_mode.sim.deployment.RULES``' (the ones infra deploys: tests/infra/test_infra_stack.py),
matched as EventBridge does (``local_mode.sim.bus.pattern_matches``)."""

from __future__ import annotations

import copy

import pytest

from local_mode.sim.bus import pattern_matches
from local_mode.sim.deployment import RULES
from tests.fixtures.events import EVENTS_DIR, load_event

CLUSTER_ARN = "arn:aws:ecs:us-east-1:123456789012:cluster/gpu-cluster"
EC2_NOTICES = ["aws_doc_ec2_capacity_block_expiration_warning.json",
               "aws_doc_ec2_spot_instance_interruption_warning.json",
               "aws_doc_ec2_capacity_reservation_instance_interruption_warning.json",
               "aws_doc_ec2_instance_rebalance_recommendation.json"]
HEALTH_NOTICES = ["aws_doc_health_ec2_instance_retirement_scheduled.json",
                  "aws_doc_health_ec2_instance_reboot_maintenance_scheduled.json"]
OTHERS = sorted(p.name for p in EVENTS_DIR.glob("*.json")
                if p.name not in EC2_NOTICES + HEALTH_NOTICES and not p.name.startswith("apigw_"))


def matching(event: dict) -> set[str]:
    return {rule.name for rule in RULES if pattern_matches(rule.pattern(CLUSTER_ARN), event)}


@pytest.mark.parametrize("fixture", EC2_NOTICES)
def test_each_ec2_notice_sample_matches_the_ec2_notice_rule_only(fixture: str) -> None:
    assert matching(load_event(fixture)) == {"ec2-capacity-notices"}


@pytest.mark.parametrize("fixture", HEALTH_NOTICES)
def test_each_health_sample_matches_the_health_rule_only(fixture: str) -> None:
    assert matching(load_event(fixture)) == {"health-scheduled-changes"}


def test_the_capacity_block_warning_by_the_guide_s_other_name_matches() -> None:
    event = load_event("aws_doc_ec2_capacity_block_expiration_warning.json")
    event["detail-type"] = "Capacity Block Reservation Expiration Warning"
    assert matching(event) == {"ec2-capacity-notices"}


@pytest.mark.parametrize("fixture", OTHERS)
def test_the_stack_s_other_events_match_no_notice_rule(fixture: str) -> None:
    event = load_event(fixture)
    if "clusterArn" in (event.get("detail") or {}):
        event["detail"]["clusterArn"] = CLUSTER_ARN
    assert not matching(event) & {"ec2-capacity-notices", "health-scheduled-changes"}


@pytest.mark.parametrize("detail_type", ["Capacity Block Delivered", "EC2 Instance State-change Notification",
                                         "EC2 Capacity Reservation Expired"])
def test_ec2_events_that_announce_no_loss_match_nothing(detail_type: str) -> None:
    event = load_event("aws_doc_ec2_capacity_block_expiration_warning.json")
    event["detail-type"] = detail_type
    assert matching(event) == set()


@pytest.mark.parametrize("change", [{"eventTypeCode": "AWS_EC2_INSTANCE_STORE_DRIVE_PERFORMANCE_DEGRADED"},
                                    {"service": "RDS"}, {"eventTypeCategory": "issue"}])
def test_other_health_events_match_nothing(change: dict) -> None:
    event = copy.deepcopy(load_event("aws_doc_health_ec2_instance_retirement_scheduled.json"))
    event["detail"].update(change)
    assert matching(event) == set()
