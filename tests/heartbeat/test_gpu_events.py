"""The node's XID log (``gpu_events``) that fault evidence reads: every reported XID with the
time it arrived, bounded in age and count, written only from what the report read."""

from __future__ import annotations

from gpu_recovery.domain import heartbeat_policy as policy
from gpu_recovery.domain.evidence import build_evidence
from gpu_recovery.domain.fault_vocabulary import Trigger
from tests.heartbeat.world import NODE

GPU = {"index": 0, "uuid": "GPU-0", "ecc_uncorrected_volatile": 0, "remapped_rows_pending": False,
       "remapped_rows_failure": False, "xids": []}


def test_reported_xids_are_kept_with_their_time(world) -> None:
    """Given two GPU reports 30 s apart carrying XID 13 then XID 79 and an unmapped XID 79,
    When a third report carries none,
    Then the node item keeps all three events with the times they arrived, and the evidence
    of a fault right after sees them although the latest telemetry has no XID."""
    svc = world.service()
    t1 = world.clock()
    svc.report_gpu(NODE, t1, [{**GPU, "xids": [13]}])
    t2 = world.clock.advance(30)
    svc.report_gpu(NODE, t2, [{**GPU, "xids": [79]}],
                   unmapped_xids=[{"pci_bus_id": "0000:10:1c.0", "xid": 79}])
    svc.report_gpu(NODE, world.clock.advance(30), [GPU])

    item = world.node_item(NODE)
    assert [(e["t"], e["g"], e["x"]) for e in item["gpu_events"]] == [
        (t1, "GPU-0", 13), (t2, "GPU-0", 79), (t2, "pci-0000:10:1c.0", 79)]
    evidence = build_evidence(node_id=NODE, fault_at=world.clock() + 5, trigger=Trigger.TASK_EXIT,
                              instance_item=item, exit_code=1)
    assert sorted((x.xid, x.gpu) for x in evidence.xids) == [
        (13, "GPU-0"), (79, "GPU-0"), (79, "pci-0000:10:1c.0")]


def test_old_events_are_dropped_and_a_quiet_report_does_not_rewrite_the_log(world) -> None:
    """Given an XID reported, When reports without XIDs follow within 72 h, Then the log is
    unchanged; When one comes after 72 h, Then the old event is gone."""
    svc = world.service()
    svc.report_gpu(NODE, world.clock(), [{**GPU, "xids": [31]}])
    svc.report_gpu(NODE, world.clock.advance(3600), [GPU])
    assert [e["x"] for e in world.node_item(NODE)["gpu_events"]] == [31]
    svc.report_gpu(NODE, world.clock.advance(72 * 3600), [GPU])
    assert world.node_item(NODE)["gpu_events"] == []


def test_merge_keeps_the_newest_events_only() -> None:
    existing = [{"t": float(i), "g": "GPU-0", "x": 13} for i in range(150)]
    merged = policy.merge_gpu_events(existing, [{"t": 200.0, "g": "GPU-1", "x": 79}], now=200.0)
    assert len(merged) == policy.MAX_GPU_EVENTS
    assert merged[-1] == {"t": 200.0, "g": "GPU-1", "x": 79}
    assert merged[0]["t"] == 51.0
