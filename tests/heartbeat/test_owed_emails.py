"""The heartbeat service's e-mails (a rank hung, a node's new hardware signals) are owed in the
write that decides them (the outbox, ``recovery.notices``) and sent after it: SNS refusing the
publish loses no e-mail, the recovery sweep sends it once its grace is over."""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import DEADLINE_SK, NotificationKind, RankState
from gpu_recovery.domain.heartbeat_policy import ReportedTask
from gpu_recovery.heartbeat.service import HeartbeatService
from gpu_recovery.recovery.notices import SEND_GRACE_SECONDS, Notices
from gpu_recovery.repository.notices import NOTICE_ITEM_TYPE
from tests.heartbeat.world import NODE, World, task_arn

#: one GPU as the node agent reports it (docs/heartbeats.md), no error counted yet
GPU = {"index": 0, "uuid": "GPU-0", "utilization_gpu": 90, "memory_used_mib": 1,
       "memory_total_mib": 2, "temperature_c": 60, "ecc_uncorrected_volatile": 0,
       "remapped_rows_pending": False, "remapped_rows_failure": False, "xids": []}


def _notices(world: World) -> list[dict[str, Any]]:
    """Every notice item of the outbox (a scan: the test's own read)."""
    table = world.local.resource("dynamodb").Table(world.local.job_table)
    items = table.scan(ConsistentRead=True)["Items"]
    return [i for i in items if i.get("item_type") == NOTICE_ITEM_TYPE]


def _refusing(world: World, monkeypatch: Any) -> None:
    def throttled(notification: Any) -> str:
        raise RuntimeError("SNS: Rate exceeded")

    monkeypatch.setattr(world.notifier, "publish", throttled)


def _swept(world: World) -> None:
    """The recovery sweep's step for an owed notice past its grace (``Notices.sweep``)."""
    world.clock.advance(SEND_GRACE_SECONDS + 1)
    outbox = Notices(world.repo.notices, world.repo.faults, world.notifier)
    for item in _notices(world):
        if DEADLINE_SK in item:
            assert outbox.sweep(item, world.clock()) == "notice_sent"


def _hang(world: World, svc: HeartbeatService) -> None:
    world.report(svc, NODE, ReportedTask(task_arn("j1", 0), step=10))
    for _ in range(11):
        world.clock.advance(30)
        world.report(svc, NODE, ReportedTask(task_arn("j1", 0), step=10))


def test_a_hung_rank_s_email_refused_by_sns_is_owed_and_sent_by_the_sweep(world: World, monkeypatch) -> None:
    """Given SNS refusing every publish, When a rank is found hung, Then the rank is HUNG with
    its e-mail owed in the outbox (due); When the sweep runs past the grace, Then it is sent."""
    world.seed_job("j1", world_size=1)
    svc = world.service(hang_seconds=300)
    _refusing(world, monkeypatch)
    _hang(world, svc)
    assert world.rank_state("j1", 0) is RankState.HUNG
    [owed] = _notices(world)
    assert owed["kind"] == NotificationKind.HUNG.value and DEADLINE_SK in owed and "sent_at" not in owed
    monkeypatch.undo()
    _swept(world)
    assert [n.kind for n in world.notifier.sent] == [NotificationKind.HUNG]
    [sent] = _notices(world)
    assert "sent_at" in sent and DEADLINE_SK not in sent


def test_a_hung_rank_s_email_sent_at_once_leaves_nothing_owed(world: World) -> None:
    world.seed_job("j1", world_size=1)
    svc = world.service(hang_seconds=300)
    _hang(world, svc)
    assert [n.kind for n in world.notifier.sent] == [NotificationKind.HUNG]
    [sent] = _notices(world)
    assert "sent_at" in sent and DEADLINE_SK not in sent


def test_a_nodes_hardware_signal_email_refused_by_sns_is_owed_and_sent_by_the_sweep(
        world: World, monkeypatch) -> None:
    """Given SNS refusing every publish, When a node reports a GPU with uncorrected ECC errors,
    Then the node is flagged with its e-mail owed in the report's own write; the sweep sends it,
    and a second report of the same signal owes nothing (notified already)."""
    world.seed_job("j1", world_size=1)
    svc = world.service()
    _refusing(world, monkeypatch)
    result = svc.report_gpu(NODE, world.clock(), [{**GPU, "ecc_uncorrected_volatile": 3}])
    assert result.notified and result.suspect
    [owed] = _notices(world)
    assert owed["kind"] == NotificationKind.SUSPECT_NODE.value and DEADLINE_SK in owed
    assert "Node flagged SUSPECT (was AVAILABLE)" in owed["body"]
    monkeypatch.undo()
    _swept(world)
    assert [n.kind for n in world.notifier.sent] == [NotificationKind.SUSPECT_NODE]
    world.clock.advance(30)
    again = svc.report_gpu(NODE, world.clock(), [{**GPU, "ecc_uncorrected_volatile": 4}])
    assert not again.notified and len(_notices(world)) == 1
