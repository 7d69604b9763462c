"""The recovery loop never loses a fault, whatever AWS call fails and in whatever order
the events arrive.

One GPU-fault recovery of a 2-node job (NCCL cascade, DCGM says reboot, the reboot
fixes it) is broken at an AWS call, once, in two ways: a throttle that does not execute
the call, and a call that executes but whose response is lost. Failed events are
redelivered as Lambda's asynchronous invocation does (twice, a minute and two minutes
later) and the sweep runs every minute. Every run must end with the job recovered and
completed, exactly one health check per suspect node, exactly one reboot of the faulty
node, and nothing stuck.

``make test`` (the quick tier) breaks the first call of every stage module and of every
API operation of the flow (24 calls), once each, the two fault models in turn along the
flow (12 lost responses, 12 throttles); without ``--quick`` (``make test-slow``) the first
call of every distinct call site too (every place the loop talks to AWS, 81 calls);
``make test-faults`` and ``make test-all`` break every call of the flow.

The campaigns run on the in-memory DynamoDB (``LocalAws(dynamodb="memory")``); one test here
runs the unbroken flow and two broken runs on moto too: the same calls in the same order,
the same call broken, the same outcome.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest

from local_mode.campaigns import recovery as campaign
from local_mode.campaigns.runner import positions_of, sample_positions
from local_mode.sim.broken_calls import LOST_RESPONSE, THROTTLE

from . import _baselines as baselines
from . import _forked as forked

EVERY_CALL = os.environ.get("GPU_RECOVERY_FAULTS") == "all"
QUICK = os.environ.get("GPU_RECOVERY_TEST_TIER") == "quick"  # tests/conftest.py


def baseline() -> campaign.RunResult:
    return baselines.baseline("gpu_fault", campaign.run_recovery)  # type: ignore[no-any-return]


def positions() -> list[int]:
    return positions_of(baseline().calls, every_call=EVERY_CALL, by="stage" if QUICK else "site")


def beyond_the_quick_tier() -> set[int]:
    """The positions the slow tier adds (marked slow, so ``-m slow`` selects them)."""
    return set(positions()) - set(sample_positions(baseline().calls, by="stage"))


def test_the_unbroken_recovery_is_exactly_right() -> None:
    result = baseline()
    assert campaign.check(result) == []
    assert result.suspects == {campaign.FAULTY: "REBOOT"}
    assert result.recovered_mails == 1 and not result.forgotten
    # The flow talks to ECS, EC2, DynamoDB, CloudWatch Logs and SNS.
    assert {c.service for c in result.calls} >= {"ecs", "ec2", "dynamodb", "cloudwatch-logs", "sns"}


def test_every_call_site_of_the_flow_is_covered() -> None:
    """The sample breaks every operation the flow uses at least once."""
    sampled = {baseline().calls[i - 1].operation for i in positions()}
    assert sampled == {c.operation for c in baseline().calls}
    assert {"StartTask", "StopTask", "RebootInstances", "TransactWriteItems", "UpdateItem", "PutItem",
            "GetItem", "Query", "BatchGetItem", "GetLogEvents", "Publish"} <= sampled


# Each run is forked from the unbroken run at the call it breaks (tests/crash_consistency/_forked.py).
@pytest.mark.parametrize(("group", "index", "mode"),
                         forked.alternating_cases("gpu_fault", positions(), calls=baseline().calls) if QUICK
                         else forked.cases("gpu_fault", positions(), calls=baseline().calls,
                                           slow=beyond_the_quick_tier()))
def test_a_fault_at_any_call_still_recovers_the_job_exactly_once(group: tuple[int, ...], index: int,
                                                                 mode: str) -> None:
    result = forked.result(campaign.run_recovery, group, index, mode)
    assert result.fired is not None, "the fault never fired"
    fired = f"{result.fired.service}.{result.fired.operation} at {result.fired.site}"
    assert campaign.check(result) == [], f"{mode} at call {index} ({fired})"


def _enter() -> int:
    """The call after the GPU fault that records the rank's stop and the job's PENDING_HEALTHCHECK."""
    return next(c.index for c in baseline().calls if c.operation == "TransactWriteItems")


def _enter_group() -> tuple[Any, ...]:
    """The group that breaks the recovery's entry in both modes: the campaign's own group, or
    (the quick tier breaks each call in one mode) a group of its own of those two runs."""
    if QUICK:
        return ((_enter(), THROTTLE), (_enter(), LOST_RESPONSE))
    return forked.group_faults(baseline().calls, next(g for g in forked.groups(positions()) if _enter() in g))


def _enter_runs() -> tuple[campaign.RunResult, campaign.RunResult]:
    return (forked.result(campaign.run_recovery, _enter_group(), _enter(), THROTTLE),
            forked.result(campaign.run_recovery, _enter_group(), _enter(), LOST_RESPONSE))


ENTER_GROUP = (forked.quick_group("gpu_fault") if QUICK
               else forked.group_of("gpu_fault", positions(), _enter()))


@pytest.mark.xdist_group(ENTER_GROUP)
def test_both_fault_models_are_injected() -> None:
    """The two models differ as they should: a throttle changes nothing, a lost response
    changes what the call was meant to change (the call that enters the recovery)."""
    throttled, lost = _enter_runs()
    assert throttled.fired is not None and lost.fired is not None
    assert throttled.fired.operation == lost.fired.operation == "TransactWriteItems"
    assert campaign.check(throttled) == [] and campaign.check(lost) == []


@pytest.mark.xdist_group(ENTER_GROUP)
def test_a_forked_fault_run_is_the_run_from_the_start() -> None:
    """The campaign's runs forked from the unbroken run at the broken call end exactly as
    the same runs made from the start: the same calls, the same call broken, the same
    verdict and outcome."""
    for forked_run in _enter_runs():
        assert forked_run.fault is not None
        scratch = campaign.run_recovery(forked_run.fault)
        assert scratch.fault == forked_run.fault
        assert [(c.index, c.service, c.operation) for c in forked_run.calls] == \
            [(c.index, c.service, c.operation) for c in scratch.calls]
        assert forked_run.fired is not None and scratch.fired is not None
        assert (forked_run.fired.index, forked_run.fired.operation) == (scratch.fired.index,
                                                                        scratch.fired.operation)
        assert campaign.check(forked_run) == campaign.check(scratch)
        for name in ("job_state", "attempt", "recoveries_used", "suspects", "health_checks", "reboots",
                     "instance_states", "stuck", "dead_letters", "recovered_mails"):
            assert getattr(forked_run, name) == getattr(scratch, name), name


# ------------------------------------------------------------------ the campaigns' DynamoDB
#: what a run's outcome is made of (compared between the two DynamoDB backends)
OUTCOME = ("job_state", "attempt", "recoveries_used", "app_restarts_used", "suspects", "health_checks",
           "reboots", "instance_states", "stuck", "dead_letters", "mails", "forgotten", "final_nodes",
           "ecs_status")


def _last_dynamodb_write() -> int:
    """The flow's last DynamoDB write (a lost response there: executed, then redelivered)."""
    return max(c.index for c in baseline().calls
               if c.service == "dynamodb" and c.operation in ("UpdateItem", "PutItem", "TransactWriteItems"))


# Slow tier: ~20 s (the whole flow twice); tests/local_mode/test_memory_backend.py holds every
# operation the flow uses to moto's answers in make test.
@pytest.mark.slow
def test_the_in_memory_dynamodb_runs_the_flow_exactly_as_moto() -> None:
    """The campaigns' DynamoDB is the in-memory store (``local_mode.sim.dynamo.botocore_backend``); on moto,
    the DynamoDB of the demo and the playground, the unbroken flow and two broken runs (the
    recovery's entry throttled, the last write's response lost) make the same AWS calls in
    the same order (service, operation, and for the unbroken run the call site), break the
    same call, and end the same."""
    assert campaign.DYNAMODB == "memory"
    for fault in (None, (_enter(), THROTTLE), (_last_dynamodb_write(), LOST_RESPONSE)):
        memory = baseline() if fault is None else campaign.run_recovery(fault)
        moto = campaign.run_recovery(fault, dynamodb="moto")
        assert [(c.index, c.service, c.operation, c.site) for c in memory.calls] == \
            [(c.index, c.service, c.operation, c.site) for c in moto.calls], fault
        if fault is not None:
            assert memory.fired is not None and moto.fired is not None, fault
            assert (memory.fired.index, memory.fired.service, memory.fired.operation) == \
                (moto.fired.index, moto.fired.service, moto.fired.operation) == \
                (fault[0], "dynamodb", memory.fired.operation), fault
        for name in OUTCOME:
            assert getattr(memory, name) == getattr(moto, name), (fault, name)
        assert campaign.check(memory) == campaign.check(moto) == [], fault


# ------------------------------------------------------------------ event orders
def _orders() -> list[tuple[str, ...]]:
    """Every distinct order of the two ranks' STOPPED events, each delivered twice."""
    return sorted(set(itertools.permutations(("faulty", "faulty", "peer", "peer"))))


#: the quick tier's orders: the faulty node's events all first, all last, and interleaved
#: (the other three orders in the slow tier)
QUICK_ORDERS = {("faulty", "faulty", "peer", "peer"), ("peer", "peer", "faulty", "faulty"),
                ("faulty", "peer", "faulty", "peer")}


@pytest.mark.parametrize("order", [pytest.param(o, marks=[] if o in QUICK_ORDERS else [pytest.mark.slow])
                                   for o in _orders()], ids=lambda o: "-".join(o))
def test_any_order_of_the_cascade_blames_the_faulty_node(order: tuple[str, ...]) -> None:
    """Given rank 1's GPU faults and NCCL kills rank 0 on the healthy node, both before
    any handler ran, When their STOPPED events (each duplicated) arrive in any order,
    Then both nodes (both ranks exited on their own) are checked once, only the faulty
    one is rebooted, and the job is restarted and completes."""
    result = campaign.run_reordered(order)
    assert campaign.check(result) == [], order
    assert result.suspects == {campaign.HEALTHY: "HEALTHY", campaign.FAULTY: "REBOOT"}
    assert result.health_checks == {campaign.HEALTHY: 1, campaign.FAULTY: 1}
