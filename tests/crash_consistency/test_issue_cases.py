"""The ways a fault was lost (issue 26), each reproduced and ending right.

1. A node decision committed (a dead GPU's node QUARANTINED; a healthy verdict after an
   application error), then a read later in the same invocation throttled past botocore's
   retries: the redelivered verdict found the decision applied and answered "duplicate",
   and the job was never settled nor e-mailed. Now the e-mail is owed in the decision's
   own transaction and everything after the commit has its own deadline.
2. A lost response on an UpdateItem while handling a rank's exit, then nothing due for the
   job.
3. The cluster's GPU nodes could not be counted on the first remediation that needed the
   count (ListContainerInstances throttled, no count ever recorded): the breaker treated the
   cluster as empty and tripped. Now the decision waits for a count.

Every run is the unbroken flow broken at that one call, checked as the campaigns check it: the
job restarted, or failed with its e-mail, nothing forgotten after any event, nothing left
pending. A flow's runs of every case are forked from one unbroken run (``_forked.py``), each at
the call it breaks: each pays for its suffix, once per flow (one xdist group a flow).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpu_recovery.domain.breaker import breaker
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.recovery.breaker.gate import ClusterCountUnavailable
from local_mode.campaigns import recovery
from local_mode.campaigns.catalog import RUNS
from local_mode.sim.broken_calls import LOST_RESPONSE, THROTTLE
from tests.recovery.fakes import world

from . import _baselines as baselines
from . import _forked as forked

FAULTY, PEER = "node-b", "node-a"

#: the node decision's re-read, the e-mail's suspect read (both throttled), and the UpdateItems
#: of a rank's exit (their answers lost): the flows each case breaks
DECISION_FLOWS, EXIT_FLOWS = ("dead_gpu", "app_error_fails"), ("gpu_fault", "app_error")
DECISION_READ = ("recovery/remediation/node_decision.py:_after_decision", "GetItem")
SUSPECT_READ = ("recovery/notices.py:for_job", "GetItem")


def _flows(flows: tuple[str, ...]) -> list[Any]:
    """Each flow in its own xdist group: its cases' runs forked from one unbroken run, once."""
    return [pytest.param(flow, marks=pytest.mark.xdist_group(f"issue-26-{flow}")) for flow in flows]


def baseline(flow: str) -> recovery.RunResult:
    return baselines.baseline(flow, RUNS[flow])  # type: ignore[no-any-return]


def first_call(flow: str, site: str, operation: str) -> int:
    return next(c.index for c in baseline(flow).calls if c.site.startswith(site) and c.operation == operation)


def after_the_decision(flow: str, site: str, operation: str) -> int:
    """The first such call after the node decision's transaction (the verdict's commit)."""
    decision = next(c.index for c in baseline(flow).calls if c.operation == "TransactWriteItems"
                    and c.site.startswith("recovery/remediation/node_decision.py:apply"))
    return next(c.index for c in baseline(flow).calls
                if c.index > decision and c.site.startswith(site) and c.operation == operation)


def exit_updates(flow: str) -> list[str]:
    """The sites of the UpdateItems the task handler makes on a rank's exit."""
    return sorted({c.site for c in baseline(flow).calls
                   if c.site.startswith("recovery/task_events.py") and c.operation == "UpdateItem"})


@cache
def flow_faults(flow: str) -> tuple[tuple[int, str], ...]:
    """Every call the cases break in ``flow``, and how (its runs made together: ``broken``)."""
    if flow in DECISION_FLOWS:
        return ((after_the_decision(flow, *DECISION_READ), THROTTLE),
                (first_call(flow, *SUSPECT_READ), THROTTLE))
    return tuple((first_call(flow, site, "UpdateItem"), LOST_RESPONSE) for site in exit_updates(flow))


def broken(flow: str, index: int, mode: str) -> recovery.RunResult:
    """The run of ``flow`` that broke call ``index`` in ``mode``: one of its cases' runs, all
    forked from one unbroken run (made once per process: ``_forked.broken``)."""
    assert (index, mode) in flow_faults(flow)
    return forked.outcome(forked.broken(RUNS[flow], flow_faults(flow)), index, mode)


# Slow tier: whole flows broken at one call a case (a flow's cases forked from one unbroken run);
# make test-campaigns breaks every call of these flows, both ways.
@pytest.mark.slow
@pytest.mark.parametrize("flow", _flows(DECISION_FLOWS))
def test_a_read_throttled_after_the_node_decision_still_settles_and_emails_the_job(flow: str) -> None:
    """The instance re-read after the decision's commit (to carry the drain out) is throttled
    past its retries: the job is FAILED, its e-mail sent, the node drained by the sweep."""
    index = after_the_decision(flow, *DECISION_READ)
    result = broken(flow, index, THROTTLE)
    assert result.fired is not None and result.fired.index == index
    assert result.problems() == []
    kind = "quarantined" if flow == "dead_gpu" else "application_error"
    assert (kind, recovery.JOB_ID) in result.mails


# Slow tier: whole flows broken at one call a case (a flow's cases forked from one unbroken run);
# make test-campaigns breaks every call of these flows, both ways.
@pytest.mark.slow
@pytest.mark.parametrize("flow", _flows(DECISION_FLOWS))
def test_the_suspect_read_for_the_email_throttled_fails_nothing_half_way(flow: str) -> None:
    """The suspect read that names the ranks in the e-mail now comes before the commit: it
    throttled, nothing is committed, the retried verdict decides, sends and settles."""
    index = first_call(flow, *SUSPECT_READ)
    result = broken(flow, index, THROTTLE)
    assert result.fired is not None and result.fired.index == index
    assert result.problems() == []


# Slow tier: whole flows broken at one call a case (a flow's cases forked from one unbroken run);
# make test-campaigns breaks every call of these flows, both ways.
@pytest.mark.slow
@pytest.mark.parametrize("flow", _flows(EXIT_FLOWS))
def test_a_lost_update_on_a_ranks_exit_leaves_nothing_forgotten(flow: str) -> None:
    """Every UpdateItem the task handler makes on a rank's exit, its answer lost: the job
    still restarts and completes, and has something due after every event."""
    sites = exit_updates(flow)
    assert sites, "the flow's task handler writes no UpdateItem"
    for site in sites:
        index = first_call(flow, site, "UpdateItem")
        result = broken(flow, index, LOST_RESPONSE)
        assert result.problems() == [], site


def test_an_uncountable_cluster_never_trips_the_breaker() -> None:
    """The first node action that needs the cluster's count (a second node in the window),
    ECS not listable and no count ever recorded: the decision waits (nothing committed), the
    breaker stays closed; the retry counts the cluster and reboots the node."""
    with world() as w:
        w.ecs.spare_nodes = [f"n-{i}" for i in range(14)]  # a 16-node cluster: 3 nodes a window
        decided = breaker.record_action(None, node="n-0", action="reboot", now=w.now[0] - 60,
                                        cluster_gpu_nodes=16)
        assert w.repo.breaker.save({k: v for k, v in decided.state.items() if k != "cluster_gpu_nodes"}, None)
        arns = w.register_job("j", [PEER, FAULTY])
        w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
        w.service.on_task_state_change(w.task_stopped(arns[0], exit_code=1))
        [task] = w.ecs.health_checks_on(FAULTY)
        stored = w.repo.breaker.read()
        assert breaker.needs_cluster_count(stored, node=FAULTY, now=w.now[0],
                                           policy=w.service.settings.remediation.breaker)
        throttled = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}
        w.ecs.fail_listing = ClientError(throttled, "ListContainerInstances")  # type: ignore[arg-type]
        listed = w.ecs.cluster_listings
        with pytest.raises(ClusterCountUnavailable):
            w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
        assert w.ecs.cluster_listings > listed
        assert (w.repo.breaker.read() or {}).get("state") != "tripped"
        # nothing committed
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.HEALTH_CHECKING
        w.ecs.fail_listing = None
        w.service.on_health_check_stopped(w.health_check_stopped(task, 1))
        stored: dict[str, Any] = w.repo.breaker.read() or {}
        assert stored.get("state") == "closed" and stored.get("cluster_gpu_nodes") == 16
        assert w.rebooter.calls == [f"i-{FAULTY}"]
