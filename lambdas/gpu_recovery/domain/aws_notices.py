"""AWS's own notices that capacity goes away on a schedule (docs/aws-notices.md). Pure.

Each notice arrives on EventBridge (the rules: ``gpu_recovery.event_patterns.aws_notice_patterns``)
and is read here into a :class:`Notice`: which instances (or which Capacity Reservation), when the
capacity goes (``deadline``), and a key that names the notice across duplicate deliveries. The
samples are in tests/events (``aws_doc_ec2_*``, ``aws_doc_health_*``) with their source pages.

* **Capacity Block Expiration Warning** (``aws.ec2``): 40 minutes before the block's
  ``end-date``; its instances start terminating 10 minutes after the warning, so the deadline is
  ``end-date`` minus 30 minutes. It names the reservation, not the instances.
* **EC2 Spot Instance Interruption Warning**: two minutes before the interruption (the event's
  ``time`` plus 120 s); **EC2 Capacity Reservation Instance Interruption Warning**: its
  ``instance-termination-time``.
* **EC2 Instance Rebalance Recommendation**: no deadline (an elevated risk only): the node takes
  no new work and its queue jobs are asked to move at their next checkpoint, never stopped.
* **AWS Health Event** of EC2's scheduled changes (retirement, reboot / system maintenance): the
  window is ``startTime`` .. ``endTime`` (RFC 1123 dates), the instances ``affectedEntities``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any

EC2_SOURCE = "aws.ec2"
HEALTH_SOURCE = "aws.health"
HEALTH_DETAIL_TYPE = "AWS Health Event"

# The Capacity Block's warning: the EventBridge events reference names it "Capacity Block
# Expiration Warning"; the EC2 guide's sample, in some versions, "Capacity Block Reservation
# Expiration Warning". Both are taken.
CAPACITY_BLOCK_EXPIRATION = ("Capacity Block Expiration Warning",
                             "Capacity Block Reservation Expiration Warning")
SPOT_INTERRUPTION = "EC2 Spot Instance Interruption Warning"
RESERVATION_INTERRUPTION = "EC2 Capacity Reservation Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
EC2_NOTICE_DETAIL_TYPES = (*CAPACITY_BLOCK_EXPIRATION, SPOT_INTERRUPTION, RESERVATION_INTERRUPTION,
                           REBALANCE_RECOMMENDATION)

#: AWS Health's EC2 scheduled changes that take an instance away for a window: retirement
#: (EBS-backed and instance-store), reboot maintenance (instance and system), system maintenance
#: and the power/network maintenance a host needs.
HEALTH_RETIREMENT_CODES = ("AWS_EC2_PERSISTENT_INSTANCE_RETIREMENT_SCHEDULED",
                           "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED")
HEALTH_REBOOT_CODES = ("AWS_EC2_INSTANCE_REBOOT_MAINTENANCE_SCHEDULED",
                       "AWS_EC2_SYSTEM_REBOOT_MAINTENANCE_SCHEDULED")
HEALTH_MAINTENANCE_CODES = ("AWS_EC2_SYSTEM_MAINTENANCE_EVENT", "AWS_EC2_INSTANCE_STOP_SCHEDULED",
                            "AWS_EC2_INSTANCE_NETWORK_MAINTENANCE_SCHEDULED",
                            "AWS_EC2_INSTANCE_POWER_MAINTENANCE_SCHEDULED")
HEALTH_EVENT_CODES = (*HEALTH_RETIREMENT_CODES, *HEALTH_REBOOT_CODES, *HEALTH_MAINTENANCE_CODES)

SPOT_WARNING_SECONDS = 120
CAPACITY_BLOCK_WARNING_SECONDS = 40 * 60  # the warning comes this long before end-date
CAPACITY_BLOCK_TERMINATION_LEAD_SECONDS = 10 * 60  # its instances start terminating this long after
#: a queue job that has not called go_suspend() this long before the deadline is stopped (its
#: ranks get SIGTERM, then SIGKILL after the task's stopTimeout, 30 s by default)
STOP_MARGIN_SECONDS = 45
#: ``FaultTally.opened_by`` of the move of a job with no control channel off an announced node:
#: stopped shortly before the deadline, relocated, no budget spent
NOTICE_FAULT = "aws_notice"


class NoticeKind(StrEnum):
    CAPACITY_BLOCK_EXPIRY = "capacity_block_expiry"
    SPOT_INTERRUPTION = "spot_interruption"
    RESERVATION_INTERRUPTION = "reservation_interruption"
    REBALANCE = "rebalance_recommendation"
    RETIREMENT = "scheduled_retirement"
    REBOOT_MAINTENANCE = "scheduled_reboot"
    MAINTENANCE = "scheduled_maintenance"


#: kinds whose nodes are also drained in ECS (DRAINING: no scheduler's new task lands there, a
#: service's tasks move off; the stack's own standalone tasks keep running until they move): a
#: Capacity Block's end takes every instance of the block for good, on a date
DRAINED_KINDS = frozenset({NoticeKind.CAPACITY_BLOCK_EXPIRY})


def owes_drain(record: dict[str, Any]) -> bool:
    """The node's notice (``Notice.as_record``) asks its drain and it is not recorded yet."""
    return record.get("kind") in {k.value for k in DRAINED_KINDS} and not record.get("drained_at")


@dataclass(frozen=True)
class Notice:
    """One notice: the capacity it names and when that capacity goes."""

    kind: NoticeKind
    key: str  # the same for every delivery of one notice (EventBridge delivers at least once)
    instance_ids: tuple[str, ...] = ()
    reservation_id: str = ""  # a Capacity Block's warning names its reservation only
    deadline: float | None = None  # when the instances go (None: a risk, no date)
    window_end: float | None = None  # a maintenance window's end (the node may come back after)
    event_time: float = 0.0
    action: str = ""  # EC2's instance-action (terminate / stop / hibernate), a Health event's code
    extra: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """A line an operator reads ("capacity block cr-... ends at ...")."""
        when = iso(self.deadline) if self.deadline is not None else ""
        if self.kind is NoticeKind.CAPACITY_BLOCK_EXPIRY:
            return (f"capacity block {self.reservation_id} ends at {self.extra.get('end_date') or '?'}: "
                    f"its instances terminate from {when}")
        if self.kind is NoticeKind.SPOT_INTERRUPTION:
            return f"Spot interruption ({self.action or 'terminate'}) at {when}"
        if self.kind is NoticeKind.RESERVATION_INTERRUPTION:
            return f"interruptible Capacity Reservation reclaimed: {self.action or 'terminate'} at {when}"
        if self.kind is NoticeKind.REBALANCE:
            return "EC2 rebalance recommendation: the Spot Instance is at elevated risk of interruption"
        until = f" to {iso(self.window_end)}" if self.window_end is not None else ""
        return f"AWS Health {self.action}: window from {when}{until}"

    def as_record(self) -> dict[str, Any]:
        """What the node's item keeps of the notice (``notice``)."""
        record: dict[str, Any] = {"kind": self.kind.value, "key": self.key, "why": self.describe()[:300],
                                  "action": self.action, "at": self.event_time}
        if self.deadline is not None:
            record["deadline"] = self.deadline
        if self.window_end is not None:
            record["window_end"] = self.window_end
        if self.reservation_id:
            record["reservation"] = self.reservation_id
        return record


def iso(epoch: float | None) -> str:
    if epoch is None:
        return "?"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> float | None:
    """An ISO 8601 date (``2024-05-10T11:30:00Z``, EC2's) or an RFC 1123 one (``Fri, 10 May 2024
    06:00:00 GMT``, AWS Health's); None when absent or unreadable."""
    text = str(value or "").strip()
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            parsed = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def parse_notice(event: dict[str, Any]) -> Notice | None:
    """The notice an EventBridge event carries; None for anything else (or a malformed one)."""
    source, detail_type = event.get("source"), event.get("detail-type")
    detail = event.get("detail")
    if not isinstance(detail, dict):
        return None
    at = parse_time(event.get("time")) or 0.0
    if source == EC2_SOURCE:
        return _ec2_notice(str(detail_type), detail, at)
    if source == HEALTH_SOURCE and detail_type == HEALTH_DETAIL_TYPE:
        return _health_notice(detail, at)
    return None


def _ec2_notice(detail_type: str, detail: dict[str, Any], at: float) -> Notice | None:
    if detail_type in CAPACITY_BLOCK_EXPIRATION:
        reservation = str(detail.get("capacity-reservation-id") or "")
        end = parse_time(detail.get("end-date"))
        if not reservation.startswith("cr-") or end is None:
            return None
        deadline = end - (CAPACITY_BLOCK_WARNING_SECONDS - CAPACITY_BLOCK_TERMINATION_LEAD_SECONDS)
        return Notice(NoticeKind.CAPACITY_BLOCK_EXPIRY, f"cb:{reservation}:{int(end)}",
                      reservation_id=reservation, deadline=deadline, window_end=end, event_time=at,
                      action="expire", extra={"end_date": iso(end)})
    instance = str(detail.get("instance-id") or "")
    if not instance.startswith("i-"):
        return None
    action = str(detail.get("instance-action") or "")
    if detail_type == SPOT_INTERRUPTION:
        # The two minutes run from the warning; its deliveries share the event's time.
        return Notice(NoticeKind.SPOT_INTERRUPTION, f"spot:{instance}:{int(at)}", (instance,),
                      deadline=at + SPOT_WARNING_SECONDS, event_time=at, action=action or "terminate")
    if detail_type == RESERVATION_INTERRUPTION:
        when = parse_time(detail.get("instance-termination-time"))
        if when is None:
            return None
        return Notice(NoticeKind.RESERVATION_INTERRUPTION, f"icr:{instance}:{int(when)}", (instance,),
                      deadline=when, event_time=at, action=action or "terminate")
    if detail_type == REBALANCE_RECOMMENDATION:
        return Notice(NoticeKind.REBALANCE, f"rebalance:{instance}", (instance,), event_time=at,
                      action="rebalance")
    return None


def _health_notice(detail: dict[str, Any], at: float) -> Notice | None:
    code = str(detail.get("eventTypeCode") or "")
    if detail.get("service") != "EC2" or code not in HEALTH_EVENT_CODES:
        return None
    if str(detail.get("statusCode") or "upcoming") == "closed":
        return None  # the window is over
    entities = detail.get("affectedEntities") or []
    instances = tuple(sorted({str(e.get("entityValue")) for e in entities
                              if isinstance(e, dict) and str(e.get("entityValue") or "").startswith("i-")}))
    start = parse_time(detail.get("startTime"))
    if not instances or start is None:
        return None
    kind = (NoticeKind.RETIREMENT if code in HEALTH_RETIREMENT_CODES
            else NoticeKind.REBOOT_MAINTENANCE if code in HEALTH_REBOOT_CODES else NoticeKind.MAINTENANCE)
    arn = str(detail.get("eventArn") or code)
    return Notice(kind, f"health:{arn}:{int(start)}", instances, deadline=start,
                  window_end=parse_time(detail.get("endTime")), event_time=at, action=code)


def move_bound(deadline: float | None, now: float, fallback_seconds: int) -> float:
    """Seconds a queue job asked to move has to checkpoint and call go_suspend(): until the
    stop margin before the deadline (at least 0), or ``fallback_seconds`` without a deadline."""
    if deadline is None:
        return float(fallback_seconds)
    return max(0.0, deadline - STOP_MARGIN_SECONDS - now)


def stop_at(deadline: float, sweep_every_seconds: float) -> float:
    """When a job that cannot be asked to checkpoint (no control channel) is stopped: two sweep
    periods before the stop margin, one for the periodic sweep that stops it to come once it is
    due, one for the next sweep to send the stop again if a call of the first failed; so its
    ranks get SIGTERM by the margin (then SIGKILL after the task's stopTimeout) before AWS
    takes the node. A Spot warning (two minutes) is stopped at once."""
    return deadline - STOP_MARGIN_SECONDS - 2 * sweep_every_seconds


def stop_due(deadline: float | None, now: float, sweep_every_seconds: float) -> bool:
    return deadline is not None and now >= stop_at(deadline, sweep_every_seconds)


def next_look(deadline: float, now: float, every_seconds: float, sweep_every_seconds: float) -> float:
    """When a node with jobs on it is looked at again: within ``every_seconds``, when its jobs
    with no control channel are due to be stopped (the next sweep, once they are), and at the
    deadline."""
    stop = stop_at(deadline, sweep_every_seconds)
    due = min(deadline, now + every_seconds, stop if stop > now else now)
    return max(now + 1, due)
