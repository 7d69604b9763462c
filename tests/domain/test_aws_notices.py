"""domain.aws_notices: each documented sample read into its notice (which capacity, when it goes)."""

from __future__ import annotations

from datetime import UTC, datetime

from gpu_recovery.domain import aws_notices as n
from tests.fixtures.events import load_event


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_capacity_block_warning_names_the_reservation_and_terminations_30_minutes_before_the_end() -> None:
    notice = n.parse_notice(load_event("aws_doc_ec2_capacity_block_expiration_warning.json"))
    assert notice is not None and notice.kind is n.NoticeKind.CAPACITY_BLOCK_EXPIRY
    assert notice.reservation_id == "cr-0123456789abcdef0" and notice.instance_ids == ()
    assert notice.deadline == epoch("2024-05-10T11:00:00")  # 10 minutes after the warning
    assert "capacity block cr-0123456789abcdef0 ends at 2024-05-10T11:30:00Z" in notice.describe()


def test_spot_warning_gives_two_minutes_from_the_event() -> None:
    notice = n.parse_notice(load_event("aws_doc_ec2_spot_instance_interruption_warning.json"))
    assert notice is not None and notice.instance_ids == ("i-1234567890abcdef0",)
    assert notice.deadline == epoch("2024-05-10T10:02:00") and notice.action == "terminate"


def test_reservation_interruption_uses_its_termination_time() -> None:
    notice = n.parse_notice(load_event("aws_doc_ec2_capacity_reservation_instance_interruption_warning.json"))
    assert notice is not None and notice.kind is n.NoticeKind.RESERVATION_INTERRUPTION
    assert notice.deadline == epoch("2024-05-10T10:02:00")


def test_rebalance_recommendation_has_no_deadline_and_never_forces() -> None:
    notice = n.parse_notice(load_event("aws_doc_ec2_instance_rebalance_recommendation.json"))
    assert notice is not None and notice.deadline is None


def test_health_events_read_the_rfc1123_window_and_the_affected_entities() -> None:
    retire = n.parse_notice(load_event("aws_doc_health_ec2_instance_retirement_scheduled.json"))
    reboot = n.parse_notice(load_event("aws_doc_health_ec2_instance_reboot_maintenance_scheduled.json"))
    assert retire is not None and retire.kind is n.NoticeKind.RETIREMENT
    assert reboot is not None and reboot.kind is n.NoticeKind.REBOOT_MAINTENANCE
    assert retire.deadline == epoch("2024-05-10T06:00:00")
    assert retire.window_end == epoch("2024-05-10T08:00:00")
    assert retire.instance_ids == ("i-1234567890abcdef0",) and retire.key != reboot.key


def test_duplicate_deliveries_share_the_key_and_malformed_events_are_none() -> None:
    event = load_event("aws_doc_ec2_capacity_block_expiration_warning.json")
    again = {**event, "id": "another-delivery"}
    assert n.parse_notice(event).key == n.parse_notice(again).key  # type: ignore[union-attr]
    assert n.parse_notice({**event, "detail": {"capacity-reservation-id": "cr-1"}}) is None
    assert n.parse_notice(load_event("aws_doc_ecs_task_state_change.json")) is None
    closed = load_event("aws_doc_health_ec2_instance_retirement_scheduled.json")
    closed["detail"]["statusCode"] = "closed"
    assert n.parse_notice(closed) is None


def test_move_bound_leaves_the_stop_margin_before_the_deadline() -> None:
    assert n.move_bound(1000.0, 100.0, 600) == 1000 - n.STOP_MARGIN_SECONDS - 100
    assert n.move_bound(100.0, 100.0, 600) == 0.0
    assert n.move_bound(None, 100.0, 600) == 600.0
