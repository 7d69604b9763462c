"""Regression tests of the node API defects measured in issue 8: 502s on malformed or
out-of-range input, the telemetry flood and the clock step-back lockout."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from gpu_recovery.constants import JobState, NotificationKind, RankState
from gpu_recovery.domain import heartbeat_policy as policy
from gpu_recovery.domain.fault_catalog import default_catalog
from gpu_recovery.domain.heartbeat_policy import HardwareSignal
from tests.heartbeat.node_api_calls import api_event, call, snapshot, tasks_body
from tests.heartbeat.world import NODE, task_arn

GPU = {"index": 0, "uuid": "GPU-0", "utilization_gpu": 90, "memory_used_mib": 1,
       "memory_total_mib": 2, "temperature_c": 60, "ecc_uncorrected_volatile": 0,
       "remapped_rows_pending": False, "remapped_rows_failure": False, "xids": []}


def gpu_body(world, gpus: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"node_id": NODE, "timestamp": world.clock(), "gpus": gpus, **extra}


def item_size(item: dict[str, Any]) -> int:
    return len(json.dumps(item, default=str))


# ------------------------------------------------------------- no 5xx on any input
@pytest.mark.parametrize(
    ("route", "make", "code", "field"),
    [
        ("apigw_report_tasks.json", lambda w: "[" * 60_000 + "]" * 60_000, "malformed_json", "body"),
        ("apigw_report_tasks.json", lambda w: '{"a":' * 40 + "1" + "}" * 40, "malformed_json", "body"),
        ("apigw_report_tasks.json", lambda w: {**tasks_body(w), "boot_time": 1e200}, "invalid_report",
         "boot_time"),
        ("apigw_report_tasks.json", lambda w: {**tasks_body(w), "boot_time": 1e-300}, "invalid_report",
         "boot_time"),
        ("apigw_report_tasks.json", lambda w: {**tasks_body(w), "timestamp": True}, "invalid_report",
         "timestamp"),
        ("apigw_report_gpu.json",
         lambda w: gpu_body(w, [{**GPU, "remapped_rows_pending": 10**39 + 1}]), "invalid_report",
         "gpus.0.remapped_rows_pending"),
        ("apigw_report_gpu.json", lambda w: gpu_body(w, [{**GPU, "index": True}]), "invalid_report",
         "gpus.0.index"),
        ("apigw_report_gpu.json",
         lambda w: json.dumps(gpu_body(w, [GPU])).replace('"GPU-0"', '"\\ud800"'), "malformed_json",
         "body"),
        ("apigw_report_gpu.json", lambda w: "1" * 5000, "malformed_json", "body"),
    ],
)
def test_malformed_or_out_of_range_reports_are_400(world, route, make, code, field) -> None:
    """Given a node, When a report is nested 60,000 deep, has boot_time 1e200 / 1e-300, a
    count of 10^39+1, a boolean for a number, a lone surrogate or a 5,000-digit number,
    Then 400 naming the field (it was a 502) and nothing is written."""
    world.seed_job("j1", world_size=1)
    before = snapshot(world)
    status, out = call(api_event(world, route, make(world)))
    assert (status, out["error"], out["field"]) == (400, code, field), out
    assert snapshot(world) == before


def test_body_that_is_not_utf8_is_400(world) -> None:
    world.seed_job("j1", world_size=1)
    event = api_event(world, "apigw_report_tasks.json", "")
    event["body"] = base64.b64encode(b'{"node_id": "\xff\xfe"}').decode()
    event["isBase64Encoded"] = True
    status, out = call(event)
    assert status == 400 and "UTF-8" in out["message"] and out["field"] == "body"


def test_tiny_and_huge_telemetry_numbers_are_stored_within_dynamodb_range(world) -> None:
    """utilization 1e-300 (in bounds) is stored rounded, not sent to DynamoDB as is."""
    world.seed_job("j1", world_size=1)
    status, out = call(api_event(world, "apigw_report_gpu.json",
                                 gpu_body(world, [{**GPU, "utilization_gpu": 1e-300,
                                                   "memory_used_mib": 1e12}])))
    assert status == 200, out
    row = world.node_item(NODE)["gpu_telemetry"][0]
    assert row["util"] == 0 and row["mem"] == 1e12


# ------------------------------------------------------------------ telemetry flood
def test_growing_ecc_on_64_gpus_sends_one_email_and_the_item_stays_small(world) -> None:
    """Given 64 GPUs whose uncorrected ECC count grows every report (54 e-mails, then a
    419 KB item and 502s before), When 40 reports arrive 30 s apart, Then every report
    is 200, one e-mail is sent, and the node item stays far below 400 KB."""
    world.seed_job("j1", world_size=1)
    svc = world.service()
    gpus = [{**GPU, "index": i, "uuid": f"GPU-{i:02d}"} for i in range(64)]
    for report in range(40):
        for gpu in gpus:
            gpu["ecc_uncorrected_volatile"] = report + 1
        if report % 20 == 10:  # through the handler: 200, not 502
            status, out = call(api_event(world, "apigw_report_gpu.json", gpu_body(world, gpus)))
            assert status == 200, out
        else:
            svc.report_gpu(NODE, world.clock(), gpus)
        world.clock.advance(30)
    assert [n.kind for n in world.notifier.sent] == [NotificationKind.SUSPECT_NODE]
    node = world.node_item(NODE)
    assert len(node["hw_signals"]) == 64 and set(node["hw_notified"]) == {"ecc_uncorrected"}
    # The largest report a node may send (64 GPUs, 128-character uuids, 256 Xids each)
    # leaves a bounded item too.
    widest = [{**GPU, "index": i, "uuid": f"{i:02d}" + "u" * 126, "xids": list(range(256)),
               "ecc_uncorrected_volatile": 2**63 - 1} for i in range(64)]
    svc.report_gpu(NODE, world.clock(), widest, [{"pci_bus_id": "p" * 64, "xid": 79}] * 256,
                   "e" * 4000)
    assert item_size(world.node_item(NODE)) < 96 * 1024, item_size(world.node_item(NODE))


def test_signals_are_bounded_whatever_a_node_sends(world) -> None:
    """256 unmapped Xids on distinct bus ids, every report with new ones: stored signals
    stay within the bound and e-mails within the per-kind rate limit."""
    world.seed_job("j1", world_size=1)
    svc = world.service()
    for report in range(12):
        unmapped = [{"pci_bus_id": f"{report:04x}:{i:02x}:00.0" + "p" * 40, "xid": 79}
                    for i in range(256)]
        svc.report_gpu(NODE, world.clock(), [GPU], unmapped)
        world.clock.advance(30)
    node = world.node_item(NODE)
    assert len(node["hw_signals"]) <= policy.MAX_STORED_SIGNALS
    assert len(world.notifier.sent) == 1
    assert item_size(node) < 64 * 1024


def test_notifications_are_rate_limited_per_node_and_kind(world) -> None:
    """A new signal of an already notified kind waits for the interval; another kind does not."""
    world.seed_job("j1", world_size=1)
    svc = world.service(signal_notify_seconds=3600)
    svc.report_gpu(NODE, world.clock(), [{**GPU, "xids": [79]}])
    world.clock.advance(30)
    second = svc.report_gpu(NODE, world.clock(), [{**GPU, "xids": [79]},
                                                  {**GPU, "index": 1, "uuid": "GPU-1", "xids": [48]}])
    assert second.new_signals == ["xid:GPU-1"] and second.suppressed == ["xid:GPU-1"]
    assert not second.notified and len(world.notifier.sent) == 1
    world.clock.advance(30)
    third = svc.report_gpu(NODE, world.clock(), [{**GPU, "ecc_uncorrected_volatile": 2}])
    assert third.notified and len(world.notifier.sent) == 2
    world.clock.advance(3600)
    fourth = svc.report_gpu(NODE, world.clock(), [{**GPU, "index": 2, "uuid": "GPU-2", "xids": [79]}])
    assert fourth.notified and len(world.notifier.sent) == 3


def test_signals_are_pruned_after_retention_and_after_a_repair(world) -> None:
    world.seed_job("j1", world_size=1)
    svc = world.service(signal_retention_seconds=3600, signal_notify_seconds=60)
    svc.report_gpu(NODE, world.clock(), [{**GPU, "xids": [79]}])
    world.clock.advance(30)
    svc.report_gpu(NODE, world.clock(), [GPU])
    assert set(world.node_item(NODE)["hw_signals"]) == {"xid:GPU-0"}
    world.clock.advance(3601)
    svc.report_gpu(NODE, world.clock(), [GPU])
    assert world.node_item(NODE)["hw_signals"] == {}
    # Seen again, then the node reboots (repair): the signal is forgotten.
    svc.report_gpu(NODE, world.clock() + 1, [{**GPU, "remapped_rows_pending": True}])
    world.clock.advance(60)
    world.report(svc, NODE)  # no boot_time: nothing pruned
    world.clock.advance(30)
    svc.report_gpu(NODE, world.clock(), [GPU])
    assert set(world.node_item(NODE)["hw_signals"]) == {"remap_pending:GPU-0"}
    world.clock.advance(30)
    svc.report_tasks(NODE, world.clock(), [], boot_time=world.clock())
    world.clock.advance(30)
    svc.report_gpu(NODE, world.clock(), [GPU])
    assert world.node_item(NODE)["hw_signals"] == {}


def test_signal_identity_is_kind_and_gpu() -> None:
    first = policy.hardware_signals([{**GPU, "ecc_uncorrected_volatile": 3, "xids": [48]}], default_catalog())
    later = policy.hardware_signals([{**GPU, "ecc_uncorrected_volatile": 900, "xids": [48, 79]}],
                                    default_catalog())
    assert [s.fingerprint for s in first] == [s.fingerprint for s in later] == [
        "ecc_uncorrected:GPU-0", "xid:GPU-0"]
    assert HardwareSignal("xid", "g", "d", "reboot").fingerprint == "xid:g"


def test_signal_action_is_the_catalogs_and_only_node_faults_are_signals() -> None:
    """XID 74's rule wants the diag first: its signal names what the rule expects (reboot);
    XID 142 only asks for the diag; XID 94 (the application's, per the catalog) and 13 are
    not signals; an XID on a GPU missing from nvidia-smi gets its rule's action too."""
    signals = policy.hardware_signals(
        [{**GPU, "xids": [74, 94]}, {**GPU, "index": 1, "uuid": "GPU-1", "xids": [142, 13]},
         {**GPU, "index": 2, "uuid": "GPU-2", "xids": [94]}],
        default_catalog(), [{"pci_bus_id": "0000:10:1c.0", "xid": 79}])
    assert [(s.fingerprint, s.detail, s.action) for s in signals] == [
        ("unmapped_xid:pci-0000:10:1c.0", "Xid 79 on a GPU missing from nvidia-smi", "reboot"),
        ("xid:GPU-0", "Xid 74", "reboot"), ("xid:GPU-1", "Xid 142", "health_check")]
    assert signals[2].describe() == "Xid 142 (GPU GPU-1; catalog: a DCGM health check)"


def test_heartbeat_service_gets_the_deployments_catalog_override(world, tmp_path, monkeypatch) -> None:
    """Given FAULT_CATALOG_OVERRIDE (as the stack sets it on every function), Then the
    heartbeat service the Lambdas build uses the same merged catalog as the recovery loop."""
    from gpu_recovery import runtime
    from gpu_recovery.constants import ENV_FAULT_CATALOG_OVERRIDE

    override = tmp_path / "override.json"
    override.write_text(json.dumps({"rules": [{"id": "xid-79", "action": "replace"}]}))
    monkeypatch.setenv(ENV_FAULT_CATALOG_OVERRIDE, str(override))
    runtime.reset(clients=False)
    try:
        catalog = runtime.heartbeat_service().catalog
        assert catalog is runtime.recovery_service().policy.catalog
        (signal,) = policy.hardware_signals([{**GPU, "xids": [79]}], catalog)
        assert signal.action == "replace"
    finally:
        runtime.reset(clients=False)


def test_old_string_set_of_signals_is_read_and_rewritten() -> None:
    stored = policy.stored_signals({"ecc:GPU-0:3", "xid:79:GPU-0"}, 100.0)
    update = policy.update_signals(stored, [], {}, 100.0 + 8 * 86400, retention_seconds=7 * 86400,
                                   notify_interval_seconds=3600)
    assert update.stored == {}


# --------------------------------------------------------------------- node clocks
def test_clock_step_back_within_skew_is_accepted_and_ranks_stay_running(world) -> None:
    """Given a node whose clock ran 290 s ahead for one report and then stepped back,
    When it keeps reporting every 30 s for 10 minutes with sweeps in between, Then every
    report is 200 (was 409 for 290 s) and its ranks never go NODE_LOST."""
    world.seed_job("j1", world_size=1)
    ahead = tasks_body(world, task_arn("j1", 0), ts=world.clock() + 290)
    assert call(api_event(world, "apigw_report_tasks.json", ahead))[0] == 200
    svc = world.service()
    for _ in range(20):
        world.clock.advance(30)
        status, out = call(api_event(world, "apigw_report_tasks.json",
                                     tasks_body(world, task_arn("j1", 0))))
        assert status == 200, out
        svc.sweep()
        assert world.rank_state("j1", 0) is RankState.RUNNING
    assert world.job_state("j1") is JobState.RUNNING


def test_gpu_report_clock_step_back_is_accepted(world) -> None:
    world.seed_job("j1", world_size=1)
    assert call(api_event(world, "apigw_report_gpu.json",
                          {**gpu_body(world, [GPU]), "timestamp": world.clock() + 290}))[0] == 200
    world.clock.advance(30)
    assert call(api_event(world, "apigw_report_gpu.json", gpu_body(world, [GPU])))[0] == 200
    status, out = call(api_event(world, "apigw_report_gpu.json", gpu_body(world, [GPU])))
    assert status == 409 and out["error"] == "replayed_report"
