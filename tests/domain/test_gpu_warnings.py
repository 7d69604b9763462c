"""The driver's warnings as data (issue 44): counter rates over the node agent's reports, the
catalog's warning rules and their validation, the warning a node's evidence raises. Pure."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpu_recovery.domain.classify import classify
from gpu_recovery.domain.evidence import Evidence, build_evidence
from gpu_recovery.domain.fault_catalog import CatalogError, default_catalog, load_catalog
from gpu_recovery.domain.fault_vocabulary import Action, GpuSignalKind, Trigger
from gpu_recovery.domain.gpu_counters import (
    NVLINK_CRC,
    NVLINK_REPLAY,
    CounterRate,
    advance,
)
from gpu_recovery.domain.gpu_warnings import asked, driver_warning, job_entry, job_key, warning_record

WINDOW = 600.0


def report(value: int | None, counter: str = NVLINK_REPLAY, gpu: str = "GPU-0") -> list[tuple[str, dict]]:
    return [(gpu, {counter: value})]


def run(values: list[tuple[float, int | None]], counter: str = NVLINK_REPLAY) -> list[list[CounterRate]]:
    """The rates each report (time, value) shows, anchors carried from one to the next."""
    stored: dict[str, Any] = {}
    shown = []
    for at, value in values:
        stored, rates = advance(stored, report(value, counter), at, WINDOW)
        shown.append(rates)
    return shown


# ------------------------------------------------------------------ counter rates
def test_the_lower_bound_keeps_noise_below_a_rate_from_matching() -> None:
    """Poisson counts: 25 errors in 10 minutes (150/h measured) are at least 60/h with three
    deviations to spare; 10 (60/h measured) are not."""
    assert CounterRate(NVLINK_REPLAY, "g", 150.0, 25, 600.0).lower_per_hour >= 60
    assert CounterRate(NVLINK_REPLAY, "g", 60.0, 10, 600.0).lower_per_hour < 60
    assert CounterRate(NVLINK_REPLAY, "g", 0.0, 0, 600.0).lower_per_hour == 0


def test_a_rate_spans_at_least_one_window_never_two_reports() -> None:
    """Given a counter rising by 1 every 30 s report, When reports come in, Then no rate
    before a whole window has passed (one error between two reports is not 120/h), then
    120/h measured over one to two windows."""
    shown = run([(30.0 * i, i) for i in range(1, 60)])
    first = next(i for i, rates in enumerate(shown) if rates)
    assert 30.0 * (first + 1) - 30.0 >= WINDOW
    for rates in shown[first:]:
        (rate,) = rates
        assert rate.per_hour == pytest.approx(120.0)
        assert WINDOW <= rate.seconds <= 2 * WINDOW


def test_a_cleared_counter_starts_again_and_zero_keeps_nothing() -> None:
    """Given a counter at 40 that a reboot clears to 0, then 3, When reports come in, Then
    the drop gives no rate (no negative, no huge one) and zeros keep no anchors."""
    stored, _ = advance({}, report(40), 0.0, WINDOW)
    stored, rates = advance(stored, report(0), 700.0, WINDOW)
    assert rates == [] and stored == {}
    stored, rates = advance(stored, report(3), 730.0, WINDOW)
    assert rates == [] and stored["GPU-0"][NVLINK_REPLAY] == [3, 730.0, 3, 730.0]
    _, rates = advance(stored, report(3), 1400.0, WINDOW)
    assert [r.per_hour for r in rates] == [0.0]


def test_the_anchors_stay_bounded_and_unlisted_gpus_are_forgotten() -> None:
    """A report of 100 GPUs keeps at most 64; a GPU the next report leaves out is dropped; a
    null counter keeps its anchors (the tool could not read it this time)."""
    many = [(f"GPU-{i}", {NVLINK_REPLAY: 5, NVLINK_CRC: 7}) for i in range(100)]
    stored, _ = advance({}, many, 0.0, WINDOW)
    assert len(stored) == 64 and all(len(c) == 2 for c in stored.values())
    stored, _ = advance(stored, [("GPU-1", {NVLINK_REPLAY: None, NVLINK_CRC: 9})], 60.0, WINDOW)
    assert set(stored) == {"GPU-1"} and stored["GPU-1"][NVLINK_REPLAY] == [5, 0.0, 5, 0.0]


# ------------------------------------------------------------------ the catalog
def telemetry(**gpu: Any) -> dict[str, Any]:
    """A node item as the heartbeat service leaves it after one report at t=1000."""
    row = {"i": 0, "u": "GPU-0", **gpu}
    return {"gpu_telemetry": [row], "last_gpu_report_at": 1000.0}


def evidence_of(item: dict[str, Any], rates: list[CounterRate] = ()) -> Evidence:
    item = dict(item)
    if rates:
        item["gpu_counter_rates"] = [r.to_dict() for r in rates]
    return build_evidence(node_id="n", fault_at=1000.0, trigger=Trigger.TELEMETRY, instance_item=item,
                          catalog=default_catalog())


@pytest.mark.parametrize(("gpu", "rule", "action", "confidence", "busy"), [
    ({"ra": "gpu_reset"}, "gpu-recovery-action-reset", Action.RESET_GPU, "announced", "move"),
    ({"ra": "drain_and_reset"}, "gpu-recovery-action-reset", Action.RESET_GPU, "announced", "move"),
    ({"ra": "node_reboot"}, "gpu-recovery-action-reboot", Action.REBOOT, "announced", "move"),
    ({"rp": True}, "gpu-remap-pending", Action.RESET_GPU, "announced", "move"),
    ({"rf": True}, "gpu-remap-failure", Action.REPLACE, "announced", "move"),
])
def test_the_drivers_own_warnings(gpu, rule, action, confidence, busy) -> None:
    """The recovery action (as the agent reports it) and the remapped-rows state are
    warnings the driver announces: what to do, how sure, what a running job does."""
    warning = driver_warning(evidence_of(telemetry(**gpu)), default_catalog())
    assert warning is not None
    assert (warning.rule_id, warning.action, warning.confidence, warning.busy_node) == \
        (rule, action, confidence, busy)


def test_no_warning_without_one_and_none_for_an_unknown_recovery_action() -> None:
    for gpu in ({}, {"ra": "none"}, {"ra": "unknown"}, {"ra": "something new"}, {"ecc": 2}):
        assert driver_warning(evidence_of(telemetry(**gpu)), default_catalog()) is None, gpu


@pytest.mark.parametrize(("counter", "per_hour", "rule"), [
    ("nvlink_replay_errors", 60.0, "gpu-nvlink-replay-rising"),
    ("nvlink_recovery_errors", 6.0, "gpu-nvlink-recovery-rising"),
    ("nvlink_crc_errors", 360000.0, "gpu-nvlink-crc-rising"),
    ("ecc_corrected_volatile", 100.0, "gpu-ecc-corrected-rising"),
])
def test_a_counter_rising_at_the_catalogs_rate_warns_and_below_it_does_not(counter, per_hour, rule) -> None:
    """A rise over 10 minutes whose lower bound (three Poisson deviations below it) reaches the
    rule's rate: a predicted warning. One error fewer, or a rise measured at exactly the rate
    (noise around a lower true rate could show it): nothing (no move, no repair)."""
    def rate(increase: int) -> CounterRate:
        return CounterRate(counter, "GPU-0", increase * 6.0, increase, 600.0)

    needed = next(n for n in range(1, 10**6) if rate(n).lower_per_hour >= per_hour)
    warning = driver_warning(evidence_of(telemetry(), [rate(needed)]), default_catalog())
    assert warning is not None and warning.rule_id == rule and warning.confidence == "predicted"
    for below in (rate(needed - 1), rate(round(per_hour / 6))):
        assert below.lower_per_hour < per_hour
        assert driver_warning(evidence_of(telemetry(), [below]), default_catalog()) is None


def test_the_repair_is_the_whole_catalogs_decision() -> None:
    """A warning's reset loses to a reboot another rule asks for on the same evidence (the
    driver's Reboot on another GPU): the node is rebooted, never reset."""
    item = {"gpu_telemetry": [{"i": 0, "u": "GPU-0", "ra": "gpu_reset"},
                              {"i": 1, "u": "GPU-1", "ra": "node_reboot"}], "last_gpu_report_at": 1000.0}
    evidence = evidence_of(item)
    assert classify(evidence, default_catalog()).action is Action.REBOOT
    assert {s.kind for s in evidence.gpu_signals} == {GpuSignalKind.RESET_REQUESTED,
                                                      GpuSignalKind.REBOOT_REQUESTED}


def test_a_job_fault_sees_the_drivers_warning_too() -> None:
    """A rank's exit on a node whose agent reported the recovery action Reset: the catalog's
    fast path resets it (the ordinary recovery, with the driver's own word)."""
    item = telemetry(ra="gpu_reset")
    evidence = build_evidence(node_id="n", fault_at=1000.0, trigger=Trigger.TASK_EXIT, instance_item=item,
                              exit_code=1, catalog=default_catalog())
    decision = classify(evidence, default_catalog(), suspect_exit_codes=(1,))
    assert decision.action is Action.RESET_GPU and decision.skip_health_check


def test_the_warning_record_asks_each_attempt_once() -> None:
    warning = driver_warning(evidence_of(telemetry(rp=True)), default_catalog())
    assert warning is not None
    record = warning_record(warning, since=5.0, jobs={job_key("j1"): job_entry("j1", 2, 6.0, "move")})
    assert asked(record, "j1", 2) and not asked(record, "j1", 3) and not asked(record, "j2", 1)


# ------------------------------------------------------------------ validation
def patched(**rule: Any) -> dict[str, Any]:
    document = copy.deepcopy(dict(default_catalog().document or {}))
    document["rules"].append({"id": "site-warning", "description": "d", "source": "s", **rule})
    return document


@pytest.mark.parametrize(("rule", "error"), [
    ({"match": {"counter_rate": {"counter": "nvlink_replay_errors", "per_hour": 10}}, "action": "reboot",
      "warning": {"confidence": "maybe"}}, "warning.confidence"),
    ({"match": {"counter_rate": {"counter": "fan_speed", "per_hour": 10}}, "action": "reboot",
      "skip_health_check": True}, "counter 'fan_speed'"),
    ({"match": {"counter_rate": {"counter": "nvlink_crc_errors", "per_hour": 0}}, "action": "reboot",
      "skip_health_check": True}, "per_hour 0"),
    ({"match": {"xid": [79]}, "action": "reboot", "skip_health_check": True,
      "warning": {"confidence": "announced"}}, "may only match what a node reports"),
    ({"match": {"gpu_signal": ["remap_pending"]}, "action": "health_check",
      "warning": {"confidence": "announced"}}, "can repair a node on a warning"),
    ({"match": {"gpu_signal": ["remap_pending"]}, "action": "reset_gpu",
      "warning": {"confidence": "announced", "busy_node": "ignore"}}, "warning.busy_node"),
])
def test_a_bad_warning_rule_fails_synthesis_naming_the_field(rule, error) -> None:
    with pytest.raises(CatalogError) as caught:
        load_catalog(patched(**rule))
    assert "site-warning" in str(caught.value) and error in str(caught.value)


def test_an_override_tunes_a_rate_and_the_window() -> None:
    """A deployment sets its own rate (the rule's match) and window (defaults)."""
    catalog = load_catalog(override={
        "defaults": {"counter_rate_window_seconds": 1800},
        "rules": [{"id": "gpu-nvlink-replay-rising",
                   "match": {"counter_rate": {"counter": "nvlink_replay_errors", "per_hour": 5}}}]})
    assert catalog.counter_window_seconds == 1800
    assert catalog.rule("gpu-nvlink-replay-rising").match.counter_rate == ("nvlink_replay_errors", 5.0)
    with pytest.raises(CatalogError, match="counter_rate_window_seconds"):
        load_catalog(override={"defaults": {"counter_rate_window_seconds": 5}})
