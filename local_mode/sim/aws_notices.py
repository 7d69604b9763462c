"""AWS's notices on the simulated bus (docs/aws-notices.md): the events EC2 and AWS Health send,
in the documented shapes (tests/events/aws_doc_ec2_*, aws_doc_health_*), and what AWS does at
the deadline (the node's tasks end with it; a reboot maintenance reboots it).

``gpu-recovery-admin inject-fault capacity-block-expiry | spot-interruption |
scheduled-maintenance --node ...`` (the playground) and the notice campaign
(``local_mode.campaigns.aws_notices``) call :func:`announce`.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

from gpu_recovery.domain import aws_notices as n

KINDS = ("capacity_block_expiry", "spot_interruption", "scheduled_maintenance", "scheduled_retirement")
#: how long after its start a scheduled maintenance window ends
WINDOW_SECONDS = 2 * 3600
#: the default lead of a scheduled event (AWS Health sends MAINTENANCE_SCHEDULED ones about two
#: weeks ahead; two days keeps a playground demo readable)
SCHEDULED_LEAD_SECONDS = 2 * 24 * 3600


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rfc1123(epoch: float) -> str:
    return format_datetime(datetime.fromtimestamp(epoch, UTC), usegmt=True)


def _envelope(source: str, detail_type: str, now: float, region: str, account: str, resources: list[str],
              detail: dict[str, Any]) -> dict[str, Any]:
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": detail_type, "source": source,
            "account": account, "time": _iso(now), "region": region, "resources": resources, "detail": detail}


def notice_event(kind: str, *, now: float, region: str, account: str, instance_id: str = "",
                 reservation_id: str = "", lead_seconds: float | None = None,
                 event_code: str = "") -> tuple[dict[str, Any], float]:
    """(the event AWS sends now, the deadline it announces) for ``kind`` (:data:`KINDS`)."""
    if kind == "capacity_block_expiry":
        end = now + n.CAPACITY_BLOCK_WARNING_SECONDS
        arn = f"arn:aws:ec2:{region}:{account}:capacity-reservation/{reservation_id}"
        event = _envelope(n.EC2_SOURCE, n.CAPACITY_BLOCK_EXPIRATION[0], now, region, account, [arn],
                          {"capacity-reservation-id": reservation_id, "end-date": _iso(end)})
        return event, end - (n.CAPACITY_BLOCK_WARNING_SECONDS - n.CAPACITY_BLOCK_TERMINATION_LEAD_SECONDS)
    if kind == "spot_interruption":
        arn = f"arn:aws:ec2:{region}:{account}:instance/{instance_id}"
        event = _envelope(n.EC2_SOURCE, n.SPOT_INTERRUPTION, now, region, account, [arn],
                          {"instance-id": instance_id, "instance-action": "terminate"})
        return event, now + n.SPOT_WARNING_SECONDS
    if kind in ("scheduled_maintenance", "scheduled_retirement"):
        start = now + (SCHEDULED_LEAD_SECONDS if lead_seconds is None else lead_seconds)
        code = event_code or (n.HEALTH_REBOOT_CODES[0] if kind == "scheduled_maintenance"
                              else n.HEALTH_RETIREMENT_CODES[0])
        detail = {
            "eventArn": f"arn:aws:health:{region}::event/EC2/{code}/{code}_{uuid.uuid4().hex[:16]}",
            "service": "EC2", "eventTypeCode": code, "eventTypeCategory": "scheduledChange",
            "eventScopeCode": "ACCOUNT_SPECIFIC", "communicationId": uuid.uuid4().hex,
            "startTime": _rfc1123(start), "endTime": _rfc1123(start + WINDOW_SECONDS),
            "lastUpdatedTime": _rfc1123(now), "statusCode": "upcoming", "eventRegion": region,
            "eventDescription": [{"language": "en_US", "latestDescription":
                                  f"Scheduled {code} for {instance_id} from {_iso(start)}"}],
            "affectedEntities": [{"entityValue": instance_id, "lastUpdatedTime": _rfc1123(now),
                                  "statusCode": "PENDING"}],
            "affectedAccount": account, "page": "1", "totalPages": "1"}
        event = _envelope(n.HEALTH_SOURCE, n.HEALTH_DETAIL_TYPE, now, region, account, [instance_id], detail)
        return event, start
    raise ValueError(f"notice kind: one of {', '.join(KINDS)}")


def announce(sim: Any, kind: str, node: str, *, lead_seconds: float | None = None,
             reservation_id: str = "", take_node: bool = True) -> dict[str, Any]:
    """Send ``kind``'s event for ``node`` now (a Capacity Block's: for every node of its
    reservation, the node's own or ``reservation_id``); at the deadline (``take_node``) AWS
    takes the node: what still runs there ends (exit 137), a reboot maintenance reboots it."""
    target = sim.node(node)
    if kind == "capacity_block_expiry":
        reservation_id = reservation_id or target.capacity_reservation_id or f"cr-{target.instance_id[2:]}"
        target.capacity_reservation_id = target.capacity_reservation_id or reservation_id
    now = sim.now()
    event, deadline = notice_event(kind, now=now, region=sim.local.region, account=sim.local.account_id,
                                   instance_id=target.instance_id, reservation_id=reservation_id,
                                   lead_seconds=lead_seconds)
    sim.schedule(now, lambda: [event], f"AWS notice {kind} {node}")
    taken = [m for m in sim.nodes.values() if m.capacity_reservation_id == reservation_id] \
        if kind == "capacity_block_expiry" else [target]
    for gone in taken:
        gone.taken_at = deadline
    if take_node:
        for gone in taken:
            sim.schedule(deadline, lambda gone=gone: _take(sim, gone.name, kind), f"AWS takes {gone.name}")
    return {"event": event, "deadline": deadline, "nodes": [m.name for m in taken]}


def _take(sim: Any, node: str, kind: str) -> list[dict[str, Any]]:
    """The deadline: the node's tasks end with it (a reboot maintenance: the node reboots)."""
    for task in sim.running_tasks(node):
        sim.inject_task_exit(task.arn, 137, after=0, why=f"AWS took the node ({kind})")
    if kind == "scheduled_maintenance":
        sim.reboot(node)
    return []
