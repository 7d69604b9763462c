"""Heartbeat semantics against moto: report, sweep, revive, terminal, missing task, hang,
SUSPECT once, NODE_LOST escalation."""

from __future__ import annotations

import pytest

from gpu_recovery.constants import (
    HB_PK,
    HB_SK,
    InstanceState,
    JobState,
    NotificationKind,
    RankState,
)
from gpu_recovery.domain.breaker import breaker
from gpu_recovery.domain.fault_catalog import load_catalog
from gpu_recovery.domain.heartbeat_policy import (
    BACKSTOP_MARGIN_SECONDS,
    BACKSTOP_RECHECK_SECONDS,
    MIN_DISCONNECT_CONFIRM_SECONDS,
    ReportedTask,
)
from gpu_recovery.domain.remediation_mode import parse_remediation_mode
from gpu_recovery.domain.remediation_settings import RemediationSettings
from gpu_recovery.domain.time_sharing import SuspendKind, suspend_record
from gpu_recovery.heartbeat.results import ReplayedReport, SweepResult
from gpu_recovery.heartbeat.service import HeartbeatService
from gpu_recovery.repository.time_sharing import (
    HoldingRepository,
    SuspensionRepository,
)
from tests.heartbeat.world import NODE, NODE_B, RecoveryLoop, charge_quota, charge_released, task_arn


def test_report_refreshes_ranks_and_node(world) -> None:
    """Given a RUNNING job with 2 ranks on one node, When the node reports both tasks,
    Then each rank gets last_heartbeat_at, its heartbeat-index shard and slot, and the node
    last_report_at."""
    world.seed_job("j1")
    svc = world.service()
    result = world.report(svc, NODE, task_arn("j1", 0), task_arn("j1", 1), "arn:aws:ecs:us-east-1:"
                          "123456789012:task/gpu-cluster/agentdaemon")
    assert result.refreshed == 2
    assert result.unknown == ["arn:aws:ecs:us-east-1:123456789012:task/gpu-cluster/agentdaemon"]
    for r in (0, 1):
        item = world.item(f"j1#{r}")
        assert item["last_heartbeat_at"] == world.clock()
        assert item[HB_PK].startswith("WATCHED#") and item[HB_SK] <= world.clock()
        assert item["last_seen_in_report_at"] == world.clock()
    assert world.node_item(NODE)["last_report_at"] == world.clock()


def _report_calls(world, svc, node: str, *tasks: str) -> list[tuple[str, str]]:
    """One task report and its AWS calls, (operation, site) in order."""
    with world.local.call_faults.recording() as calls:
        world.report(svc, node, *tasks)
    return [(c.operation, c.site) for c in calls]


def test_a_report_listing_no_task_reads_no_rank(world) -> None:
    """Given a node running a job's ranks and a spare, When the spare reports no task, Then its
    report is one write (its node item), no read of the ranks' index; When the busy node
    reports, Then the index is read (its ranks refreshed)."""
    world.seed_job("j1")
    svc = world.service()
    world.report(svc, NODE_B)  # the spare's first report registers its item
    world.clock.advance(30)
    assert _report_calls(world, svc, NODE_B) == [("UpdateItem", "heartbeat/service.py:_touch_node")]
    assert world.node_item(NODE_B)["last_report_at"] == world.clock()
    calls = _report_calls(world, svc, NODE, task_arn("j1", 0), task_arn("j1", 1))
    assert ("Query", "heartbeat/service.py:_live_ranks_by_key") in calls
    assert world.item("j1#0")["last_heartbeat_at"] == world.clock()


def test_replayed_timestamp_is_rejected_without_writes(world) -> None:
    """Given an accepted report at t, When the same timestamp is sent again,
    Then ReplayedReport and the ranks' heartbeat is unchanged."""
    world.seed_job("j1")
    svc = world.service()
    world.report(svc, NODE, task_arn("j1", 0))
    before = world.item("j1#0")["last_heartbeat_at"]
    world.clock.advance(10)
    with pytest.raises(ReplayedReport):
        world.report(svc, NODE, task_arn("j1", 0), at=world.clock() - 10)
    assert world.item("j1#0")["last_heartbeat_at"] == before


def test_stale_sweep_marks_node_lost_then_heartbeat_revives(world) -> None:
    """Given ranks with a heartbeat, When no report comes for > 180 s and the sweep runs,
    Then ranks and job are NODE_LOST (history entry); When a heartbeat comes again,
    Then both are RUNNING again."""
    world.seed_job("j1")
    svc = world.service()
    world.report(svc, NODE, task_arn("j1", 0), task_arn("j1", 1))
    world.clock.advance(170)
    assert svc.sweep().marked_lost == []
    world.clock.advance(20)
    swept = svc.sweep()
    assert sorted(swept.marked_lost) == ["j1#0", "j1#1"]
    assert world.job_state("j1") is JobState.NODE_LOST
    assert world.rank_state("j1", 0) is RankState.NODE_LOST
    history = world.item("j1#JOB")["history"]
    assert history[-1]["to"] == "NODE_LOST" and "no heartbeat" in history[-1]["reason"]
    world.clock.advance(30)
    result = world.report(svc, NODE, task_arn("j1", 0))
    assert result.revived == ["j1#0"]
    assert world.job_state("j1") is JobState.NODE_LOST  # rank 1 still lost
    world.report(svc, NODE, task_arn("j1", 0), task_arn("j1", 1), at=world.clock() + 1)
    assert world.rank_state("j1", 1) is RankState.RUNNING
    assert world.job_state("j1") is JobState.RUNNING
    assert world.item("j1#JOB")["history"][-1]["to"] == "RUNNING"


def test_rank_without_heartbeat_is_never_marked_lost(world) -> None:
    """Given a RUNNING rank that never had a heartbeat (upgrade safety),
    When the sweep runs much later, Then nothing changes (it is not in the index)."""
    world.seed_job("j1")
    world.clock.advance(10_000)
    assert world.service().sweep().read == 0
    assert world.job_state("j1") is JobState.RUNNING


def test_terminal_job_is_never_revived(world) -> None:
    """Given a NODE_LOST job that then FAILED (ranks still NODE_LOST in the table),
    When a late heartbeat arrives, Then job stays FAILED, the rank is not RUNNING and
    it leaves the heartbeat index."""
    world.seed_job("j1", world_size=1)
    svc = world.service()
    world.report(svc, NODE, task_arn("j1", 0))
    world.clock.advance(200)
    svc.sweep()
    assert world.job_state("j1") is JobState.NODE_LOST
    world.repo.tables.db.apply(world.repo.jobs.job_transition("j1", JobState.FAILED,
                                                              from_states=[JobState.NODE_LOST], attempt=1,
                                                              reason="operator", actor="test"))
    result = world.report(svc, NODE, task_arn("j1", 0))
    assert result.revived == []
    assert world.job_state("j1") is JobState.FAILED
    assert world.rank_state("j1", 0) is RankState.NODE_LOST
    assert HB_PK not in world.item("j1#0")


def test_terminal_rank_is_ignored_and_unindexed(world) -> None:
    """Given a rank that finished (DONE through rank_update), Then hb_bucket is removed and
    a late report of its task is ignored (no write makes it RUNNING)."""
    ranks = world.seed_job("j1", world_size=1)
    svc = world.service()
    world.report(svc, NODE, task_arn("j1", 0))
    assert world.repo.tables.db.apply(world.repo.jobs.rank_update(ranks[0], RankState.DONE,
                                                                  from_states=[RankState.RUNNING]))
    assert HB_PK not in world.item("j1#0")
    result = world.report(svc, NODE, task_arn("j1", 0), at=world.clock() + 1)
    assert result.refreshed == 0
    assert world.rank_state("j1", 0) is RankState.DONE


def test_task_missing_from_node_reports_goes_stale(world) -> None:
    """Given 2 ranks on a node, When the node keeps reporting but omits rank 1 for > 180 s,
    Then the sweep marks only rank 1 NODE_LOST, with a 'missing from reports' reason."""
    world.seed_job("j1")
    svc = world.service()
    world.report(svc, NODE, task_arn("j1", 0), task_arn("j1", 1))
    for _ in range(7):
        world.clock.advance(30)
        world.report(svc, NODE, task_arn("j1", 0))
    swept = svc.sweep()
    assert swept.marked_lost == ["j1#1"]
    assert world.rank_state("j1", 0) is RankState.RUNNING
    assert "missing from node" in world.item("j1#1")["node_lost_reason"]
    assert world.job_state("j1") is JobState.NODE_LOST


def test_sweep_reads_only_stale_ranks(world) -> None:
    """Given 6 watched ranks of which 2 are stale, Then the sweep reads 2 items."""
    world.seed_job("old", world_size=2, nodes=(NODE_B,))
    world.seed_job("fresh", world_size=4)
    svc = world.service()
    world.report(svc, NODE_B, task_arn("old", 0), task_arn("old", 1))
    world.clock.advance(200)
    world.report(svc, NODE, *[task_arn("fresh", r) for r in range(4)])
    assert svc.sweep().read == 2


def test_hang_detection_and_recovery(world) -> None:
    """Given hang_seconds=300, When a rank keeps reporting the same step for > 300 s,
    Then rank and job are HUNG and operators are notified once (kind hung);
    When the step advances, Then both are RUNNING again."""
    world.seed_job("j1", world_size=1)
    svc = world.service(hang_seconds=300)
    world.report(svc, NODE, ReportedTask(task_arn("j1", 0), step=10))
    for _ in range(11):
        world.clock.advance(30)
        world.report(svc, NODE, ReportedTask(task_arn("j1", 0), step=10))
    assert world.rank_state("j1", 0) is RankState.HUNG
    assert world.job_state("j1") is JobState.HUNG
    assert [n.kind for n in world.notifier.sent] == [NotificationKind.HUNG]
    assert world.recovery.calls == []
    world.clock.advance(30)
    result = world.report(svc, NODE, ReportedTask(task_arn("j1", 0), step=11))
    assert result.unhung == ["j1#0"]
    assert world.job_state("j1") is JobState.RUNNING


def test_hang_action_recover_hands_job_to_recovery(world) -> None:
    """Given hang_action=recover, When a rank hangs, Then report_suspected_fault is called
    once with the rank's instance."""
    world.seed_job("j1", world_size=1)
    svc = world.service(hang_seconds=60, hang_action="recover")
    world.report(svc, NODE, ReportedTask(task_arn("j1", 0), step=5))
    for _ in range(4):
        world.clock.advance(30)
        world.report(svc, NODE, ReportedTask(task_arn("j1", 0), step=5))
    assert [(c[0], c[1], c[2]) for c in world.recovery.calls] == [("j1", 1, NODE)]


def test_no_step_never_hangs(world) -> None:
    """Given hang detection on, When reports carry no step, Then the rank stays RUNNING."""
    world.seed_job("j1", world_size=1)
    svc = world.service(hang_seconds=60)
    for _ in range(10):
        world.report(svc, NODE, task_arn("j1", 0))
        world.clock.advance(30)
    assert world.rank_state("j1", 0) is RankState.RUNNING


def _lose(world, svc, job: str = "j1") -> None:
    world.report(svc, NODE, task_arn(job, 0))
    world.clock.advance(200)
    svc.sweep()
    assert world.job_state(job) is JobState.NODE_LOST


def test_node_lost_too_long_with_agent_connected_goes_to_recovery(world) -> None:
    """Given a job NODE_LOST, When it stays so for > node_lost_fail_seconds and ECS says
    the agent is connected, Then the recovery loop gets a suspected fault (once)."""
    world.seed_job("j1", world_size=1)
    svc = world.service(node_lost_fail_seconds=600)
    _lose(world, svc)
    world.clock.advance(500)
    assert svc.sweep().escalated == []
    world.clock.advance(200)
    assert svc.sweep().escalated == ["j1"]
    assert world.recovery.calls[0][:3] == ("j1", 1, NODE)
    # Only a job still NODE_LOST may be escalated: a heartbeat may revive it meanwhile.
    assert world.recovery.from_states[0] == [JobState.NODE_LOST]


def _lost_too_long(world, loop: RecoveryLoop, job: str = "j1") -> SweepResult:
    """NODE_LOST past the limit with the node agent silent (``_lose``), the ECS agent read
    disconnected at a first sweep (nothing decided) and again 3 minutes later: that sweep's result."""
    _lose(world, loop.heartbeat, job)
    world.clock.advance(700)
    first = loop.heartbeat.sweep()
    assert first.confirming == [job] and first.failed == []
    world.clock.advance(MIN_DISCONNECT_CONFIRM_SECONDS)
    return loop.heartbeat.sweep()


def test_node_lost_too_long_with_agent_disconnected_fails_and_quarantines(world) -> None:
    """Given NODE_LOST too long, its node agent silent and the ECS agent read disconnected at two
    sweeps 3 minutes apart, Then one node decision: the
    job FAILED with the fault's evidence and decision, its task asked to stop, the node
    QUARANTINED + drained (counted by the breaker, recorded in the node's history with a
    summary of its evidence), one NODE_LOST notification; the rank leaves the heartbeat
    index."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world)
    assert _lost_too_long(world, loop).failed == ["j1"]
    assert world.job_state("j1") is JobState.FAILED
    assert world.instance_state(NODE) is InstanceState.QUARANTINED
    assert loop.ecs.drained and loop.ecs.stop_calls == [task_arn("j1", 0)]
    assert world.ecs.drained == [] and world.ecs.stopped == []  # only the recovery loop acts
    assert [n.kind for n in world.notifier.sent] == [NotificationKind.NODE_LOST]
    assert "Decision: replace" in world.notifier.sent[0].body
    job = world.item("j1#JOB")
    record = job["last_fault"]
    assert (record["node"], record["attempt"]) == (NODE, 1)
    assert record["plan"]["decision"]["rule_id"] == "builtin:node-unreachable"
    assert record["evidence"]["trigger"] == "node_lost"
    node = world.node_item(NODE)
    [entry] = node["fault_history"]
    assert (entry["cause"], entry["action"], entry["executed"]) == (
        "builtin:node-unreachable", "replace", True)
    assert entry["evidence"]["trigger"] == "node_lost"
    assert [w["node"] for w in loop.repo.breaker.read()["window"]] == [NODE]
    assert HB_PK not in world.item("j1#0")
    world.clock.advance(60)
    assert loop.heartbeat.sweep().read == 0  # nothing left to re-read


def test_observe_mode_and_a_lost_node_stop_and_drain_nothing(world) -> None:
    """Given remediation_mode observe, When a node is lost too long with its agent
    disconnected, Then no StopTask and no drain (heartbeat or recovery loop), the node stays
    AVAILABLE with the would-be quarantine recorded as not executed, the job FAILED in the
    table only, one 'observed' e-mail, and the rank is no longer watched."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world, RemediationSettings(modes=parse_remediation_mode("observe")))
    assert _lost_too_long(world, loop).failed == ["j1"]
    assert loop.ecs.stop_calls == [] and loop.ecs.drained == []
    assert world.ecs.stopped == [] and world.ecs.drained == []
    assert world.instance_state(NODE) is InstanceState.AVAILABLE
    assert world.job_state("j1") is JobState.FAILED
    history = world.node_item(NODE)["fault_history"]
    assert [(r["action"], r["executed"]) for r in history] == [("replace", False)]
    assert [n.kind for n in world.notifier.sent] == [NotificationKind.OBSERVED]
    assert "Would have done (not carried out): stop_tasks, drain" in world.notifier.sent[0].body
    assert loop.repo.breaker.read() is None  # nothing acted on, nothing counted
    world.clock.advance(60)
    loop.heartbeat.sweep()
    assert HB_PK not in world.item("j1#0") and loop.ecs.stop_calls == []


def test_a_tripped_breaker_holds_the_quarantine_of_a_lost_node(world) -> None:
    """Given the breaker at its limit (1 node of a 2-node cluster acted on), When a node is
    lost with its agent disconnected, Then it is not drained: SUSPECT with the held-back
    quarantine in the backlog; the job still fails and its task is asked to stop."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world, cluster_nodes=2)
    decided = breaker.record_action(None, node="other", action="reboot", now=world.clock() + 800,
                                    cluster_gpu_nodes=2)
    assert loop.repo.breaker.save(decided.state, None)
    assert _lost_too_long(world, loop).failed == ["j1"]
    assert loop.ecs.drained == [] and loop.ecs.stop_calls == [task_arn("j1", 0)]
    inst = loop.repo.instances.get_instance(NODE)
    assert inst.state is InstanceState.SUSPECT and inst.breaker_blocked["action"] == "replace"
    assert inst.breaker_blocked["quarantine_only"] is True
    # Known bad all the same: cordoned (no new work) with the quarantine held.
    assert inst.cordoned and inst.cordon["cause"] == "builtin:node-unreachable"
    state = loop.repo.breaker.read()
    assert state["state"] == "tripped" and [b["node"] for b in state["backlog"]] == [NODE]
    kinds = [n.kind for n in world.notifier.sent]
    assert kinds.count(NotificationKind.BREAKER_TRIPPED) == 1 and NotificationKind.NODE_LOST in kinds


def test_a_lost_node_decision_whose_answer_was_lost_is_finished_by_the_next_sweeps(world) -> None:
    """Given the decision's transaction committed but its answer lost (nothing after it
    ran), When the heartbeat sweep runs again, Then the job's tasks are asked to stop once,
    and the recovery sweep drains the node (its follow-up deadline)."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world)
    loop.repo.fail_once("decisions.record", "lose")
    assert _lost_too_long(world, loop).failed == []
    assert world.job_state("j1") is JobState.FAILED and loop.ecs.stop_calls == [] and loop.ecs.drained == []
    world.clock.advance(61)
    loop.heartbeat.sweep()
    assert loop.ecs.stop_calls == [task_arn("j1", 0)]
    loop.service.sweep()
    assert len(loop.ecs.drained) == 1
    world.clock.advance(61)
    loop.heartbeat.sweep()
    loop.service.sweep()
    assert loop.ecs.stop_calls == [task_arn("j1", 0)] and len(loop.ecs.drained) == 1
    # The e-mail was owed with the decision (its outbox item): the sweep sent it, once.
    assert [n.kind for n in world.notifier.sent] == [NotificationKind.NODE_LOST]


def test_a_lost_node_whose_host_still_reports_is_a_suspect_never_quarantined(world) -> None:
    """Given a node whose ECS introspection fails (a tenant's container wedged dockerd): its
    node agent keeps reporting, with no task, so the rank is NODE_LOST; When it stays so past
    the limit with the ECS agent read disconnected at two sweeps, Then the job fails as for an
    unreachable node (its task asked to stop) but the node is not condemned: SUSPECT (no new
    work), not drained, nothing in its history or in the breaker's window, one e-mail saying so."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world)
    svc = loop.heartbeat
    world.report(svc, NODE, task_arn("j1", 0))
    for _ in range(15):  # the host reports every minute, listing no task
        world.clock.advance(60)
        world.report(svc, NODE)
        svc.sweep()
    assert world.job_state("j1") is JobState.NODE_LOST
    assert "missing from node" in world.item("j1#JOB")["history"][-1]["reason"]
    assert world.instance_state(NODE) is InstanceState.AVAILABLE  # one reading decides nothing
    for _ in range(3):
        world.clock.advance(60)
        world.report(svc, NODE)
        swept = svc.sweep()
    assert swept.failed == ["j1"]
    assert world.job_state("j1") is JobState.FAILED and loop.ecs.stop_calls == [task_arn("j1", 0)]
    assert world.instance_state(NODE) is InstanceState.SUSPECT
    assert loop.ecs.drained == [] and world.ecs.drained == []
    node = world.node_item(NODE)
    assert "fault_history" not in node and "ECS agent" in node["suspect_reason"]
    assert loop.repo.breaker.read() is None
    fault = world.item("j1#JOB")["last_fault"]
    assert fault["plan"]["decision"]["rule_id"] == "builtin:ecs-agent-disconnected"
    assert fault["plan"]["execute"] == ["stop_tasks"]
    [mail] = world.notifier.sent
    assert mail.kind is NotificationKind.NODE_LOST
    assert "flagged SUSPECT" in mail.body and "not quarantined" in mail.body
    world.clock.advance(60)
    world.report(svc, NODE)
    svc.sweep()  # the decision's stops converged: nothing asked again
    assert loop.ecs.stop_calls == [task_arn("j1", 0)] and world.instance_state(NODE) is InstanceState.SUSPECT


def test_a_lost_node_is_unreachable_only_when_a_later_reading_confirms_it(world) -> None:
    """Given a node whose ECS agent and node agent are both silent, NODE_LOST past the limit,
    When a sweep reads the ECS agent disconnected once, Then nothing is decided (the reading is
    stored on the rank); a sweep a minute later decides nothing either, and the recovery sweep's
    backstop, due before any later reading, waits for it instead of handing the job on; When a
    sweep at least 3 minutes after the first reads it again, Then the node is quarantined as before."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world)
    _lose(world, loop.heartbeat)
    lost_at = world.clock()
    world.clock.advance(601)
    loop.heartbeat.sweep()
    assert world.job_state("j1") is JobState.NODE_LOST
    assert world.instance_state(NODE) is InstanceState.AVAILABLE
    assert loop.ecs.drained == [] and loop.ecs.stop_calls == [] and world.notifier.sent == []
    first = world.clock()
    assert world.item("j1#0")["ecs_disconnected_seen_at"] == first
    assert world.item("j1#JOB")["heartbeat_escalate_at"] == first + MIN_DISCONNECT_CONFIRM_SECONDS
    world.clock.advance(60)
    assert loop.heartbeat.sweep().confirming == ["j1"]
    world.clock.advance(lost_at + 600 + BACKSTOP_MARGIN_SECONDS + 10 - world.clock())  # its first deadline
    loop.service.sweep()
    assert world.job_state("j1") is JobState.NODE_LOST
    assert loop.heartbeat.sweep().failed == ["j1"]
    assert world.instance_state(NODE) is InstanceState.QUARANTINED and len(loop.ecs.drained) == 1
    [entry] = world.node_item(NODE)["fault_history"]
    assert (entry["cause"], entry["executed"]) == ("builtin:node-unreachable", True)


def _first_reading_then_no_heartbeat_sweep(world) -> tuple[RecoveryLoop, float]:
    """j1 NODE_LOST on NODE (both agents silent), its ECS agent read disconnected once; then no
    heartbeat sweep comes (each failed: ``node_lost`` at 8 %, seed 347). Returns when the
    recovery sweep's backstop is due: the hand-over's time and its margin past."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world)
    _lose(world, loop.heartbeat)
    world.clock.advance(601)
    loop.heartbeat.sweep()
    escalate_at = float(world.item("j1#JOB")["heartbeat_escalate_at"])
    world.clock.advance(escalate_at + BACKSTOP_MARGIN_SECONDS + 10 - world.clock())
    return loop, escalate_at


def test_the_backstop_hands_no_node_ecs_reads_disconnected_to_a_check(world) -> None:
    """Given a lost node's first disconnected reading and no heartbeat sweep after it, When the
    recovery sweep's backstop comes and ECS still reads the node's agent disconnected, Then the
    job is not handed to a DCGM check (ECS cannot place one there: it would end undiagnosed and
    leave the dead node AVAILABLE); it waits, looked at again, and the heartbeat sweep's second
    reading, when one comes, quarantines the node as unreachable."""
    loop, _ = _first_reading_then_no_heartbeat_sweep(world)
    for _ in range(3):
        loop.service.sweep()
        assert world.job_state("j1") is JobState.NODE_LOST, world.item("j1#JOB")["history"]
        assert float(world.item("j1#JOB")["deadline_at"]) > world.clock()
        world.clock.advance(BACKSTOP_MARGIN_SECONDS)
    assert loop.ecs.start_calls == [] and loop.ecs.described.count(NODE) == 3
    assert loop.heartbeat.sweep().failed == ["j1"]
    assert world.instance_state(NODE) is InstanceState.QUARANTINED
    assert [m.kind for m in world.notifier.sent] == [NotificationKind.NODE_LOST]


def test_the_backstop_hands_a_node_over_when_ecs_reads_its_agent_back(world) -> None:
    """Given the same, When the backstop finds the node's ECS agent connected, Then the job goes
    to its node's check as before."""
    loop, _ = _first_reading_then_no_heartbeat_sweep(world)
    loop.ecs.agent_connected[NODE] = True
    loop.service.sweep()
    assert world.job_state("j1") is JobState.PENDING_HEALTHCHECK, world.item("j1#JOB")["history"]


def test_the_backstop_hands_a_node_over_after_an_hour_without_a_heartbeat_decision(world) -> None:
    """Given the same, ECS reading the agent disconnected all along, When no heartbeat sweep has
    decided the node an hour after the hand-over's time, Then the backstop hands the job over."""
    loop, escalate_at = _first_reading_then_no_heartbeat_sweep(world)
    loop.service.sweep()
    assert world.job_state("j1") is JobState.NODE_LOST
    world.clock.advance(escalate_at + BACKSTOP_RECHECK_SECONDS + 1 - world.clock())
    loop.service.sweep()
    assert world.job_state("j1") is JobState.PENDING_HEALTHCHECK, world.item("j1#JOB")["history"]


def test_a_connected_reading_makes_the_next_disconnected_one_a_first_reading_again(world) -> None:
    """Given a lost node's ECS agent read disconnected, When a later sweep reads it connected
    (an agent update, a blip), Then the job goes to the recovery loop's check and the stored
    reading is forgotten: a disconnected reading after that is a first one again, deciding nothing."""
    world.seed_job("j1", world_size=1)
    svc = world.service(node_lost_fail_seconds=600)
    _lose(world, svc)
    world.clock.advance(700)
    world.ecs.connected = False
    swept = svc.sweep()
    assert world.recovery.unreachable == [] and swept.confirming == ["j1"]
    world.clock.advance(60)
    world.ecs.connected = True
    assert svc.sweep().escalated == ["j1"]  # the stub leaves the job NODE_LOST
    assert "ecs_disconnected_seen_at" not in world.item("j1#0")
    world.clock.advance(MIN_DISCONNECT_CONFIRM_SECONDS)
    world.ecs.connected = False
    swept = svc.sweep()
    assert world.recovery.unreachable == [] and swept.confirming == ["j1"]
    assert world.item("j1#0")["ecs_disconnected_seen_at"] == world.clock()
    world.clock.advance(MIN_DISCONNECT_CONFIRM_SECONDS)
    svc.sweep()
    assert world.recovery.unreachable == [("j1", NODE, False)]  # confirmed: both agents silent


def test_node_lost_fail_disabled(world) -> None:
    """Given node_lost_fail_seconds=0, Then NODE_LOST lasts until a heartbeat or an operator."""
    world.seed_job("j1", world_size=1)
    svc = world.service(node_lost_fail_seconds=0)
    _lose(world, svc)
    world.clock.advance(100_000)
    assert svc.sweep().escalated == [] and world.recovery.calls == []


HEALTHY = {"index": 0, "uuid": "GPU-0", "utilization_gpu": 90, "memory_used_mib": 1,
           "memory_total_mib": 2, "temperature_c": 60, "ecc_uncorrected_volatile": 0,
           "remapped_rows_pending": False, "remapped_rows_failure": False, "xids": []}


def test_gpu_report_flags_suspect_once_per_new_signal(world) -> None:
    """Given an AVAILABLE node, When reports carry Xid 79, Then SUSPECT and one notification;
    When the same signal repeats, Then no new notification; When a new one comes, one more."""
    world.seed_job("j1", world_size=1)
    svc = world.service()
    result = svc.report_gpu(NODE, world.clock(), [HEALTHY])
    assert result.signals == [] and world.instance_state(NODE) is InstanceState.AVAILABLE
    bad = {**HEALTHY, "xids": [79]}
    world.clock.advance(30)
    assert svc.report_gpu(NODE, world.clock(), [bad]).new_signals == ["xid:GPU-0"]
    assert world.instance_state(NODE) is InstanceState.SUSPECT
    world.clock.advance(30)
    assert svc.report_gpu(NODE, world.clock(), [bad]).new_signals == []
    world.clock.advance(30)
    assert svc.report_gpu(NODE, world.clock(), [{**bad, "ecc_uncorrected_volatile": 2}]).new_signals \
        == ["ecc_uncorrected:GPU-0"]
    kinds = [n.kind for n in world.notifier.sent]
    assert kinds == [NotificationKind.SUSPECT_NODE, NotificationKind.SUSPECT_NODE]
    # A pending remap is a driver warning: the recovery loop acts on it (its record is the
    # intent, due for the sweep) and says so; nothing is flagged or e-mailed here.
    world.clock.advance(30)
    result = svc.report_gpu(NODE, world.clock(), [{**bad, "remapped_rows_pending": True}])
    assert result.warning == "gpu-remap-pending" and result.new_signals == []
    assert len(world.notifier.sent) == 2
    assert world.node_item(NODE)["warning"]["rule"] == "gpu-remap-pending"
    telemetry = world.node_item(NODE)["gpu_telemetry"]
    assert telemetry[0]["u"] == "GPU-0" and telemetry[0]["x"] == [79]


def test_xid_79_mail_names_the_catalog_action_and_the_job_it_hits(world) -> None:
    """Given a job with 2 ranks on a node, When its telemetry carries XID 79, Then the e-mail
    says what the catalog's xid-79 rule does (reboot, not a hard-coded "replace"), the ranks
    on that node and the job's recovery count."""
    world.seed_job("j1", world_size=2)
    world.service().report_gpu(NODE, world.clock(), [{**HEALTHY, "xids": [79]}])
    (mail,) = world.notifier.sent
    assert "Xid 79 (GPU GPU-0; catalog: reboot)" in mail.body
    assert "Ranks:              0, 1" in mail.body and "Recovery attempt:   0 of 1" in mail.body


def test_signal_mail_without_a_job_has_no_rank_or_attempt_lines(world) -> None:
    """Given an idle node, When it reports an uncorrected ECC error, Then the e-mail is about
    the node and leaves out the job-only lines (no "Ranks: -", no "0 of 0")."""
    svc = world.service()
    world.report(svc, NODE_B)
    svc.report_gpu(NODE_B, world.clock(), [{**HEALTHY, "ecc_uncorrected_volatile": 2}])
    (mail,) = world.notifier.sent
    assert f"node {NODE_B}" in mail.subject and "catalog: reboot" in mail.body
    assert "Ranks:" not in mail.body and "Recovery attempt:" not in mail.body


def test_signal_actions_follow_a_catalog_override(world) -> None:
    """Given an override that replaces on XID 79 and treats XID 48 as the application's,
    Then the 79 signal needs replace and 48 flags nothing (the catalog decides both)."""
    catalog = load_catalog(None, override={"rules": [{"id": "xid-79", "action": "replace"},
                                                     {"id": "xid-48", "action": "application_error",
                                                      "skip_health_check": False}]})
    svc = world.service(catalog=catalog)
    assert svc.report_gpu(NODE, world.clock(), [{**HEALTHY, "xids": [48]}]).signals == []
    world.clock.advance(30)
    svc.report_gpu(NODE, world.clock(), [{**HEALTHY, "xids": [48, 79]}])
    (mail,) = world.notifier.sent
    assert "Xid 79 (GPU GPU-0; catalog: replace)" in mail.body


def test_gpu_signal_does_not_clobber_recovery_states(world) -> None:
    """Given a node REBOOTING, When a hardware signal arrives, Then it stays REBOOTING
    (operators are still told once)."""
    world.seed_job("j1", world_size=1)
    world.repo.tables.db.apply(world.repo.instances.instance_update(NODE, to=InstanceState.REBOOTING))
    svc = world.service()
    svc.report_gpu(NODE, world.clock(), [{**HEALTHY, "ecc_uncorrected_volatile": 3}])
    assert world.instance_state(NODE) is InstanceState.REBOOTING
    assert len(world.notifier.sent) == 1


def test_application_xid_is_not_a_signal(world) -> None:
    """Xid 13 / 63 are telemetry only."""
    world.seed_job("j1", world_size=1)
    svc = world.service()
    svc.report_gpu(NODE, world.clock(), [{**HEALTHY, "xids": [13, 63]}])
    assert world.instance_state(NODE) is InstanceState.AVAILABLE and world.notifier.sent == []


def test_first_report_of_unknown_node_creates_its_item(world) -> None:
    """Given a node with no container-instance item, When it reports, Then the item is
    created (ECS is asked for its ARN / EC2 id) and last_report_at set."""
    svc = world.service()
    world.report(svc, NODE_B)
    item = world.node_item(NODE_B)
    assert item["last_report_at"] == world.clock()
    assert item["ec2_instance_id"] == "i-0123456789abcdef0"


def _replay_reports(svc, world, node: str, per_report: int, reports: int) -> list:
    """``reports`` GPU reports 30 s apart, NVLink replay errors rising by ``per_report`` each."""
    results = []
    for i in range(reports):
        world.clock.advance(30)
        gpu = {**HEALTHY, "nvlink_replay_errors": 1 + i * per_report}
        results.append(svc.report_gpu(node, world.clock(), [gpu]))
    return results


def test_nvlink_replays_rising_past_the_catalogs_rate_raise_a_predicted_warning(world) -> None:
    """Given an idle node whose agent reports NVLink replay errors rising by 1 a report (120/h,
    the catalog's limit 60/h), When 10 to 20 minutes of reports are in (the rise's lower bound
    reaches 60/h), Then the node carries the warning (once: later reports write nothing more),
    its counters' anchors stay four numbers, and the rate is on the item for the evidence."""
    svc = world.service()
    world.report(svc, NODE_B)
    results = _replay_reports(svc, world, NODE_B, 1, 45)
    first = next(i for i, r in enumerate(results) if r.warning)
    assert 20 <= first <= 40
    item = world.node_item(NODE_B)
    assert item["warning"]["rule"] == "gpu-nvlink-replay-rising"
    assert item["warning"]["confidence"] == "predicted"
    assert len(item["gpu_counters"]["GPU-0"]["nvlink_replay_errors"]) == 4
    assert item["gpu_counter_rates"][0]["per_hour"] == pytest.approx(120.0)
    assert world.notifier.sent == []  # the recovery loop says what it does


def test_nvlink_replays_below_the_rate_raise_nothing(world) -> None:
    """The same counter rising by 1 every fourth report (30/h, half the catalog's 60/h): no
    warning, however long it goes on."""
    svc = world.service()
    world.report(svc, NODE_B)
    results = []
    for i in range(60):
        world.clock.advance(30)
        gpu = {**HEALTHY, "nvlink_replay_errors": 1 + i // 4}
        results.append(svc.report_gpu(NODE_B, world.clock(), [gpu]))
    assert not any(r.warning for r in results)
    assert "warning" not in world.node_item(NODE_B)


# ------------------------------------------------- a node lost while its job is suspending


def _charged_and_suspending(world, svc: HeartbeatService) -> HoldingRepository:
    """A 1-rank queue job holding one node of alice's quota, heartbeating, then preempted with
    the longest grace (its ranks are not asked to stop for an hour): SUSPENDING."""
    holding = charge_quota(world, "j1")
    world.report(svc, NODE, task_arn("j1", 0))
    now = world.clock()
    suspend = suspend_record(SuspendKind.PREEMPTED, "preempted by job h", grace_seconds=3600, now=now,
                             by_job="h", by_user="bob", by_priority=100)
    assert SuspensionRepository(world.repo.jobs).request("j1", 1, suspend=suspend, deadline_at=now + 3600,
                                                         reason="preempted", actor="scheduler")
    world.clock.advance(200)
    svc.sweep()
    assert world.job_state("j1") is JobState.SUSPENDING
    assert world.rank_state("j1", 0) is RankState.NODE_LOST
    return holding


@pytest.mark.parametrize("host_reporting", [False, True], ids=["both_agents_silent", "host_reporting"])
def test_a_node_lost_for_good_while_its_job_is_suspending_fails_the_job(world, host_reporting: bool) -> None:
    """Given a queue job SUSPENDING (a long grace) whose node falls silent, When its rank stays
    NODE_LOST past the limit with the ECS agent read disconnected at two sweeps, Then the job is
    not left SUSPENDING (its rank cannot be confirmed stopped, so it cannot resume elsewhere): it
    fails as a RUNNING job would, the reason naming the node and the suspension not completed,
    its task asked to stop, one e-mail; the node is quarantined (both agents silent) or flagged
    SUSPECT (its host still reports); the scheduler's tick releases the job's quota charge."""
    world.seed_job("j1", world_size=1)
    loop = RecoveryLoop(world)
    svc = loop.heartbeat
    holding = _charged_and_suspending(world, svc)
    world.clock.advance(700)
    if host_reporting:
        world.report(svc, NODE)  # the host reports, listing no task
    assert svc.sweep().confirming == ["j1"]
    world.clock.advance(MIN_DISCONNECT_CONFIRM_SECONDS)
    if host_reporting:
        world.report(svc, NODE)
    assert svc.sweep().failed == ["j1"]
    assert world.job_state("j1") is JobState.FAILED
    error = world.item("j1#JOB")["last_error"]
    assert NODE in error and "suspension could not be completed" in error
    assert loop.ecs.stop_calls == [task_arn("j1", 0)]
    node_after = InstanceState.SUSPECT if host_reporting else InstanceState.QUARANTINED
    assert world.instance_state(NODE) is node_after
    [mail] = world.notifier.sent
    assert mail.kind is NotificationKind.NODE_LOST and "suspension could not be completed" in mail.body
    charge_released(world, holding, "j1")


def test_a_node_lost_while_suspending_whose_ecs_agent_answers_is_left_to_the_suspension(world) -> None:
    """Given a SUSPENDING job whose rank is NODE_LOST past the limit, When ECS still reaches the
    node (agent connected), Then nothing is decided: its suspension's stop reaches the task."""
    world.seed_job("j1", world_size=1)
    svc = world.service(node_lost_fail_seconds=600)
    _charged_and_suspending(world, svc)
    world.clock.advance(700)
    swept = svc.sweep()
    assert swept.escalated == [] and swept.failed == [] and swept.confirming == []
    assert world.recovery.calls == [] and world.recovery.unreachable == []
    assert world.job_state("j1") is JobState.SUSPENDING
