"""Large gangs, stage by stage with fakes of the ports: the stop and restart fan-out
(batches on a queue), paced re-asks, grouped StartTask, the ECS budget, health checks
held to their per-job share, oversized jobs refused loudly, and bounded e-mails."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
from botocore.exceptions import ClientError

from gpu_recovery import constants as C
from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.constants import JobState, NotificationKind
from gpu_recovery.domain.fault_tally import tally_shard_count
from gpu_recovery.domain.gang_batches import INLINE_MAX_RANKS
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.rate_limit import TokenBucket
from gpu_recovery.recovery import sweep as sweep_mod
from gpu_recovery.recovery.fanout_send import RESEND_AFTER_SECONDS, SEND_CLAIM_SECONDS
from gpu_recovery.recovery.gang import MAX_STOP_ROUNDS, REASK_AFTER_SECONDS, RECHECK_SECONDS
from gpu_recovery.recovery.node_tasks import HEALTH_CHECK_POLL_SECONDS
from gpu_recovery.recovery.ranks import registration_from_tags
from gpu_recovery.repository.latches import LatchRepository
from tests.recovery.fakes import FakeTask, LostResponse, World, throttle_once, world

WORLD = 40  # > INLINE_MAX_RANKS: batches go through the queue


def _nodes(n: int) -> list[str]:
    return [f"node-{i:03d}" for i in range(n)]


def _stopped_by_us(w: World, exit_code: int = 143) -> int:
    """Every task ECS was asked to stop reports STOPPED (once), as ECS would."""
    done = 0
    for arn in list(dict.fromkeys(w.ecs.stop_calls)):
        task = w.ecs.tasks[arn]
        if task.last_status == "STOPPED":
            continue
        w.service.on_task_state_change(w.task_stopped(
            arn, exit_code=exit_code, stop_code="UserInitiated", reason="gpu-recovery: suspected GPU fault"))
        done += 1
    return done


def _verdict(w: World, node: str, exit_code: int) -> None:
    [task] = [t for t in w.ecs.health_checks_on(node) if t.last_status == "RUNNING"]
    w.service.on_health_check_stopped(w.health_check_stopped(task, exit_code))


def test_a_large_gang_is_stopped_in_batches_and_restarted_ten_ranks_per_start_task() -> None:
    assert WORLD > INLINE_MAX_RANKS
    with world(gang_queue=True) as w:
        nodes = _nodes(WORLD)
        arns = w.register_job("big", nodes)
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        assert w.repo.jobs.get_job("big").state is JobState.PENDING_HEALTHCHECK
        assert w.ecs.stop_calls == []  # nothing stopped in the event's own invocation
        assert [m[0]["op"] for m in w.queue.messages] == ["stop"]
        assert w.drain_queue() == 1
        assert sorted(w.ecs.stop_calls) == sorted(arns[:-1])
        assert _stopped_by_us(w) == WORLD - 1
        job = w.repo.jobs.get_job("big")
        assert job.tally.total == 1 and job.stop_fanout == {}  # every rank ended; one suspect
        _verdict(w, nodes[-1], 0)  # healthy: an application error, restarts need a budget
        job = w.repo.jobs.get_job("big")
        assert job.state is JobState.FAILED and "application error" in job.last_error
        assert w.queue.messages == []


def _restart_pending(w: Any) -> None:
    """Job "big" on WORLD nodes; its last rank exits 1, the gang stops, the node is found
    healthy: the restart on the same nodes (application budget 1) is queued."""
    nodes = _nodes(WORLD)
    arns = w.register_job("big", nodes)
    w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
    w.drain_queue()
    _stopped_by_us(w)
    _verdict(w, nodes[-1], 0)


def _first_start_fails(w: Any, fault: str) -> None:
    """The restart pending (``_restart_pending``), its batch's first StartTask to fail with
    ``fault`` (``FakeEcs.failures``)."""
    _restart_pending(w)
    w.ecs.start_calls.clear()
    w.ecs.failures["start_task"] = [fault]


def test_a_restart_starts_identical_ranks_ten_per_call_and_tells_once() -> None:
    with world(gang_queue=True, max_app_restarts=1) as w:
        _restart_pending(w)
        job = w.repo.jobs.get_job("big")
        assert job.state is JobState.STARTING and job.attempt == 2
        assert [m[0]["op"] for m in w.queue.messages] == ["start"]
        w.ecs.start_calls.clear()
        w.drain_queue()
        # 40 identical ranks on 40 nodes: four StartTasks of ten, every rank registered once.
        assert w.ecs.start_calls == [10, 10, 10, 10]
        assert [r.attempt for r in w.repo.jobs.get_ranks(w.repo.jobs.get_job("big"))] == [2] * WORLD
        job = w.repo.jobs.get_job("big")
        assert job.state is JobState.RUNNING
        recovered = [n for n in w.notifier.sent if n.kind is NotificationKind.RECOVERED]
        assert len(recovered) == 1 and len(recovered[0].body) < 8_000
        # A duplicate of the batch (SQS is at-least-once) starts nothing.
        w.service.on_gang_batch({"op": "start", "job_id": "big", "attempt": 2, "first": 0, "last": WORLD},
                                receive_count=2)
        assert w.ecs.start_calls == [10, 10, 10, 10]
        assert len([n for n in w.notifier.sent if n.kind is NotificationKind.RECOVERED]) == 1


def _die_once_at_registered_arrival(w: World, dying_rank: int) -> list[int]:
    """Makes the worker die once, after registering `dying_rank`, at its latch arrival; the
    list returned gets the rank when it has died."""
    real = w.repo.latches.arrive
    died: list[int] = []

    def dies_once(job_id: str, attempt: int, world_size: int, rank: int, latches: Any,
                  **kwargs: Any) -> Any:
        if Latch.REGISTERED in latches and rank == dying_rank and not died:
            died.append(rank)
            raise TimeoutError("the worker died after the registration (injected)")
        return real(job_id, attempt, world_size, rank, latches, **kwargs)

    w.repo.latches.arrive = dies_once  # type: ignore[method-assign]
    return died


def test_a_registration_whose_latch_arrival_died_is_counted_by_the_sweep_s_resend() -> None:
    """The start batch dies between rank 12's registration and its latch arrival. The sweep
    sends the restart's batch again after RESEND_AFTER_SECONDS (a new message: SQS counts a
    first receive): it starts the ranks not started, rank 12 arrives then (with its node), and
    the restart is confirmed at once, not minutes later. The goodput ledger's restart ends at the last rank's
    registration (the gang waits for it), not at rank 0's."""
    with world(gang_queue=True, max_app_restarts=1) as w:
        _restart_pending(w)
        died = _die_once_at_registered_arrival(w, 12)
        with pytest.raises(TimeoutError):
            w.drain_queue()
        assert died == [12] and w.repo.jobs.get_job("big").state is JobState.STARTING
        assert w.repo.jobs.get_rank("big", 12).attempt == 2 and w.repo.jobs.get_rank("big", 39).attempt == 1
        w.advance(RESEND_AFTER_SECONDS + 1)
        w.service.sweep()
        w.drain_queue()
        job = w.repo.jobs.get_job("big")
        assert job.state is JobState.RUNNING, job.state
        rank0, last = w.repo.jobs.get_rank("big", 0), w.repo.jobs.get_rank("big", WORLD - 1)
        assert last.registered_at - rank0.registered_at > RESEND_AFTER_SECONDS
        item = w.repo.jobs.get_job_item("big") or {}
        [confirmed] = [e for e in item["history"] if e.get("to") == JobState.RUNNING.value
                       and e.get("from") == JobState.STARTING.value]
        assert confirmed["gp"]["running_at"] == int(last.registered_at)
        # Its arrival again records its node, as its first would have (what the attempt's nodes
        # are read from: a relocation's, the placement holds', preemption's).
        nodes = {w.repo.jobs.get_rank("big", r).container_inst_id for r in range(WORLD)}
        assert w.repo.latches.job_nodes("big", 2, WORLD) == nodes


def test_a_batch_resent_late_in_its_sweep_is_resent_again_by_the_sweep_two_minutes_on() -> None:
    """The restart's batch dies (rank 12); the sweep two minutes on sends it again, 5 s into
    its run (a slow SendMessageBatch), and that delivery dies too (rank 20). The sweep a minute
    later leaves it (55 s old: it may still be running); the sweep after, 115 s after that send,
    sends it again, and the job runs. Waiting for a full RESEND_AFTER_SECONDS skipped that
    sweep: resends came three minutes apart, and a launch was given up after two resends in
    its eight minutes (driver_warning s430 at 8 %)."""
    with world(gang_queue=True, max_app_restarts=1) as w:
        assert w.queue is not None
        _restart_pending(w)
        first_died = _die_once_at_registered_arrival(w, 12)
        with pytest.raises(TimeoutError):
            w.drain_queue()
        assert first_died == [12]
        w.advance(60)
        w.service.sweep()
        assert not w.queue.messages  # sent a minute ago: left to run
        send = w.queue.send

        def slow_send(bodies: Any, delay_seconds: int = 0) -> None:
            w.advance(5)
            send(bodies, delay_seconds)

        w.queue.send = slow_send  # type: ignore[method-assign]
        w.advance(60)
        w.service.sweep()
        assert w.queue.messages
        died = _die_once_at_registered_arrival(w, 20)
        with pytest.raises(TimeoutError):
            w.drain_queue()
        assert died == [20]
        sends = w.queue.sends
        w.advance(55)  # the next sweep, at its own second: 55 s after the late send
        w.service.sweep()
        assert w.queue.sends == sends
        w.advance(60)
        w.service.sweep()
        assert w.queue.sends == sends + 1, "the sweep 115 s after the late send sends the batch again"
        w.drain_queue()
        assert w.repo.jobs.get_job("big").state is JobState.RUNNING


def test_a_rank_whose_call_started_is_registered_with_its_own_node_s_task() -> None:
    """The start batch dies at the latch arrival of rank 18, the ninth of the call of ranks
    10-19: rank 19, placed by the same StartTask, is not registered. The sweep's resend takes
    its lease over and looks the call's startedBy up: of the ten tasks listed, rank 19 gets the
    one on its own node, and no rank is started again."""
    with world(gang_queue=True, max_app_restarts=1) as w:
        _restart_pending(w)
        died = _die_once_at_registered_arrival(w, 18)
        with pytest.raises(TimeoutError):
            w.drain_queue()
        assert died == [18]
        assert w.repo.jobs.get_rank("big", 18).attempt == 2 and w.repo.jobs.get_rank("big", 19).attempt == 1
        starts = list(w.ecs.start_calls)
        w.advance(RESEND_AFTER_SECONDS + 1)
        w.service.sweep()
        w.drain_queue()
        assert w.repo.jobs.get_job("big").state is JobState.RUNNING
        # Only the calls the dead delivery never made (ranks 20-39) start afterwards.
        assert w.ecs.start_calls[:len(starts)] == starts and sum(w.ecs.start_calls[len(starts):]) == 20
        for rank in w.repo.jobs.get_ranks(w.repo.jobs.get_job("big")):
            assert w.ecs.tasks[rank.task_arn].node == rank.container_inst_id, rank.rank


def test_a_batch_out_of_ecs_budget_goes_back_to_the_queue_delayed() -> None:
    with world(gang_queue=True) as w:
        arns = w.register_job("big", _nodes(WORLD))
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        real = w.ecs.prepay
        calls = {"n": 0}

        def once_limited(count: int) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RateLimited(7.2)
            real(count)

        w.ecs.prepay = once_limited  # type: ignore[method-assign]
        assert w.drain_queue() == 1
        assert w.ecs.stop_calls == []
        [(body, visible_at)] = w.queue.messages
        assert body["op"] == "stop" and visible_at == w.now[0] + 8
        w.advance(8)
        assert w.drain_queue() == 1
        assert len(set(w.ecs.stop_calls)) == WORLD - 1


def test_a_stop_intent_read_by_several_events_at_once_is_sent_once() -> None:
    """A fault's first ranks stop together (a GPU's 8 one-GPU ranks): every event that read the
    intent unsent used to send all its batches (4 sends of 82 batches at 8,192 ranks, racing
    each other for the same ranks); one claims the sending, the others leave it."""
    with world(gang_queue=True) as w:
        arns = w.register_job("big", _nodes(WORLD))
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        job = w.repo.jobs.get_job("big")
        assert job.stop_fanout.get("sent_at") and w.queue.sends == 1
        # Another event read the intent before it was confirmed: it sends nothing.
        read_before = replace(job, stop_fanout={k: v for k, v in job.stop_fanout.items() if k != "sent_at"})
        assert not w.service.gang.stop(read_before)
        assert w.queue.sends == 1


def test_a_stop_intent_whose_sender_died_is_sent_by_the_sweep_once_its_claim_is_stale() -> None:
    with world(gang_queue=True, health_check_timeout_seconds=20_000) as w:
        arns = w.register_job("big", _nodes(WORLD))
        w.queue.fail_next = 1  # the claim is written, the send fails: the sender is gone
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        assert w.queue.messages == [] and not w.repo.jobs.get_job("big").stop_fanout.get("sent_at")
        w.advance(SEND_CLAIM_SECONDS - 5)
        w.service.sweep()
        assert w.queue.sends == 0  # the claim may still be its sender's
        for _ in range(4):  # the job's next looks (its deadline, each minute) after the claim
            w.advance(30)
            w.service.sweep()
        assert [m[0]["op"] for m in w.queue.messages] == ["stop"] and w.queue.sends == 1
        assert w.repo.jobs.get_job("big").stop_fanout.get("sent_at")
        w.drain_queue()
        assert sorted(w.ecs.stop_calls) == sorted(arns[:-1])


def test_an_event_retried_a_minute_later_sends_the_stop_intent_its_dead_delivery_claimed() -> None:
    """Lambda retries a failed event after a minute: the claim its delivery left is stale by
    then, so the retry sends the intent itself (not only the sweep)."""
    with world(gang_queue=True) as w:
        arns = w.register_job("big", _nodes(WORLD))
        event = w.task_stopped(arns[-1], exit_code=1)
        w.queue.fail_next = 1
        w.service.on_task_state_change(event)
        assert w.queue.sends == 0
        w.advance(60)
        w.service.on_task_state_change(event)
        assert w.queue.sends == 1 and w.repo.jobs.get_job("big").stop_fanout.get("sent_at")
        w.drain_queue()
        assert sorted(w.ecs.stop_calls) == sorted(arns[:-1])


# Slow tier (CI runs it: make test-slow): a whole emulated fan-out (~4-8 s); the other
# fan-out tests here (large gangs, batches of ten, lookups by tags) stay in make test.
@pytest.mark.slow
def test_stops_not_confirmed_are_asked_again_at_a_paced_interval_not_per_event() -> None:
    with world(gang_queue=True, health_check_timeout_seconds=20_000) as w:
        arns = w.register_job("big", _nodes(WORLD))
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        w.drain_queue()
        asked = len(w.ecs.stop_calls)
        # The same STOPPED event, redelivered many times, asks nothing again.
        for _ in range(5):
            w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        assert len(w.ecs.stop_calls) == asked and w.queue.messages == []
        # The ranks never stop (lost agent): the sweep asks again after 2, 4, 8... minutes.
        rounds = []
        for _ in range(80):  # 160 minutes
            w.advance(120)
            w.service.sweep()
            w.drain_queue()
            rounds.append(len(w.ecs.stop_calls) // asked)
        assert rounds[-1] == 1 + MAX_STOP_ROUNDS  # then given up (a person looks at the node)
        first_reask = rounds.index(2)
        assert (first_reask + 1) * 120 >= RECHECK_SECONDS
        # Each re-ask waits twice as long as the one before.
        changes = [i for i in range(1, len(rounds)) if rounds[i] != rounds[i - 1]]
        gaps = [b - a for a, b in itertools.pairwise(changes)]
        assert gaps == sorted(gaps) and gaps[-1] >= 2 * gaps[0]


def test_a_start_call_that_fails_still_lets_the_batch_s_other_calls_start_first() -> None:
    """The restart batch's first StartTask (ranks 0-9) is throttled: the batch still makes its
    other three calls (ranks 10-39) before it fails (tried again), so one call failing at each
    try never holds the others back (8 % sweep preflight_forged_baseline s39: rank 0's look-up
    failed at every resend and rank 1 was never started, three launches in a row); the sweep's
    resend then starts ranks 0-9 only."""
    with world(gang_queue=True, max_app_restarts=1) as w:
        _first_start_fails(w, "refuse")
        with pytest.raises(ClientError):
            w.drain_queue()
        assert w.ecs.start_calls == [10, 10, 10, 10]
        ranks = {r.rank: r.attempt for r in w.repo.jobs.get_ranks(w.repo.jobs.get_job("big"))}
        assert [r for r, attempt in ranks.items() if attempt == 2] == list(range(10, WORLD))
        w.advance(RESEND_AFTER_SECONDS + 1)
        w.service.sweep()
        w.drain_queue()
        assert w.repo.jobs.get_job("big").state is JobState.RUNNING
        assert sum(w.ecs.start_calls[4:]) == 10


def test_a_stop_task_refused_for_one_rank_still_asks_the_batch_s_others_first() -> None:
    """A throttled StopTask fails its batch (tried again) only once the batch's other ranks were
    asked: the next rank may be the one on a node AWS takes at a deadline."""
    with world() as w:
        arns = w.register_job("pair", _nodes(3))
        w.ecs.failures["stop_task"] = ["refuse"]  # rank 0's
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))  # "the sweep sends it"
        assert w.ecs.stop_calls == [arns[1]]
        w.advance(RECHECK_SECONDS)
        w.service.sweep()  # rank 0 (marked, not asked) is asked again
        assert arns[0] in w.ecs.stop_calls[1:]


def test_a_stop_round_waits_for_the_fan_out_s_own_duration_at_the_stack_s_ecs_rate() -> None:
    """Stops that take longer than the recheck at the stack's ECS rate (8,192 ranks at 36 a
    second: 228 s) are not asked again while the first fan-out may still be stopping them."""
    bucket = TokenBucket(rate=0.1, burst=100)  # 40 ranks: 400 s of StopTasks at this rate
    with world(gang_queue=True, health_check_timeout_seconds=20_000, ecs_api=bucket) as w:
        arns = w.register_job("big", _nodes(WORLD))
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        w.drain_queue()
        asked, sent_at = len(w.ecs.stop_calls), w.now[0]
        while len(w.ecs.stop_calls) == asked:  # the ranks never stop: the first re-ask
            w.advance(60)
            w.service.sweep()
            w.drain_queue()
        assert w.now[0] - sent_at >= WORLD / bucket.rate + REASK_AFTER_SECONDS


def test_health_checks_are_held_to_the_jobs_share_and_the_restart_waits_for_every_verdict() -> None:
    with world(max_health_checks_per_job=2, max_app_restarts=1, check_all_nodes_on_fault=True) as w:
        nodes = _nodes(5)
        arns = w.register_job("j", nodes)
        for arn in arns:  # an NCCL cascade: every rank exits 1 on its own
            w.service.on_task_state_change(w.task_stopped(arn, exit_code=1))
        running = [n for n in nodes if any(t.last_status == "RUNNING" for t in w.ecs.health_checks_on(n))]
        assert len(running) == 2
        job = w.repo.jobs.get_job("j")
        assert job.tally.total == 5 and job.state is JobState.PENDING_HEALTHCHECK
        checked: set[str] = set()
        while len(checked) < 5:
            node = next(n for n in nodes if n not in checked and any(
                t.last_status == "RUNNING" for t in w.ecs.health_checks_on(n)))
            _verdict(w, node, 0)
            checked.add(node)
            busy = [n for n in nodes if any(t.last_status == "RUNNING" for t in w.ecs.health_checks_on(n))]
            assert len(busy) <= 2
        job = w.repo.jobs.get_job("j")
        # Every verdict counted (4 on the tally's shards, the last one on the job item).
        assert job.tally.total == 5 and job.state in (JobState.STARTING, JobState.RUNNING)
        assert w.repo.slots.running() == 0


def test_a_job_larger_than_supported_is_refused_loudly_once(caplog: Any) -> None:
    with world() as w:
        arn = "arn:aws:ecs:us-east-1:111122223333:task/gpu-cluster/huge0"
        tags = [{"key": C.TAG_JOB_ID, "value": "huge"}, {"key": C.TAG_RANK, "value": "0"},
                {"key": C.TAG_WORLD_SIZE, "value": str(C.MAX_WORLD_SIZE + 1)}]
        w.ecs.tasks[arn] = FakeTask(arn, "node-000", "user", "family:train")
        w.ecs.describe_task = lambda task_arn: {  # type: ignore[method-assign]
            "taskArn": task_arn, "containerInstanceArn": "ci/node-000", "tags": tags, "lastStatus": "RUNNING"}
        with caplog.at_level("WARNING"):
            for _ in range(3):
                w.service.on_task_state_change(w.task_stopped(arn, exit_code=1))
        assert w.repo.jobs.get_job("huge") is None
        refused = [n for n in w.notifier.sent if n.kind is NotificationKind.JOB_REFUSED]
        assert len(refused) == 1 and str(C.MAX_WORLD_SIZE) in refused[0].body
        assert sum("too large to protect" in r.message for r in caplog.records) == 3
        try:
            registration_from_tags({"taskArn": arn}, tags)
        except ValueError as error:
            assert "at most" in str(error)


def test_a_job_whose_tasks_have_no_room_for_the_attempt_tag_is_refused_loudly_once(caplog: Any) -> None:
    """ECS takes 50 tags a task (aws: ones aside) and a restarted task carries its original's
    tags plus gpu-recovery:attempt (issue 40): a tagged job whose tasks carry 50 without it
    could never be restarted, so it is refused at registration, with one e-mail saying what
    to do, rather than failing at its first restart."""
    with world() as w:
        arn = "arn:aws:ecs:us-east-1:111122223333:task/gpu-cluster/full0"
        ours = [{"key": C.TAG_JOB_ID, "value": "full"}, {"key": C.TAG_RANK, "value": "0"},
                {"key": C.TAG_WORLD_SIZE, "value": "2"}]
        theirs = [{"key": f"team:label{i}", "value": "x"} for i in range(47)]
        managed = [{"key": "aws:ecs:clusterName", "value": "gpu-cluster"}]  # not counted by ECS
        tags = ours + theirs + managed
        w.ecs.tasks[arn] = FakeTask(arn, "node-000", "user", "family:train")
        w.ecs.describe_task = lambda task_arn: {  # type: ignore[method-assign]
            "taskArn": task_arn, "containerInstanceArn": "ci/node-000", "tags": tags, "lastStatus": "RUNNING"}
        with caplog.at_level("WARNING"):
            for _ in range(3):
                w.service.on_task_state_change(w.task_stopped(arn, exit_code=1))
        assert w.repo.jobs.get_job("full") is None
        [refused] = [n for n in w.notifier.sent if n.kind is NotificationKind.JOB_REFUSED]
        assert "carry 50 tags" in refused.body and f"{C.TAG_ATTEMPT}=1" in refused.body
        assert sum("too many tags" in r.message for r in caplog.records) == 3
        # Room for the attempt tag: 49 of them, or 50 with the attempt tag among them.
        assert registration_from_tags({"taskArn": arn}, ours + theirs[:46] + managed).rank == 0
        with_attempt = [*ours, {"key": C.TAG_ATTEMPT, "value": "1"}, *theirs[:46]]
        assert registration_from_tags({"taskArn": arn}, with_attempt).attempt == 1


def test_a_rank_that_never_registered_is_found_by_its_tags_and_stopped() -> None:
    """Given rank 7's RUNNING event was lost (no rank item), When the gang is stopped,
    Then the rank is found running by its tags (once: its attempt's registered latch is
    incomplete), registered and stopped with the others, and the end latch completes."""
    with world(gang_queue=True) as w:
        nodes = _nodes(WORLD)
        arns = w.register_job("big", nodes)
        lost = w.lose_registration("big", 7, nodes[7], world_size=WORLD)
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        w.drain_queue()
        assert w.ecs.tag_lookups == 1 and lost in w.ecs.stop_calls and arns[7] not in w.ecs.stop_calls
        assert _stopped_by_us(w) == WORLD - 1
        assert w.repo.jobs.get_job("big").tally.total == 1


def test_a_rank_found_by_its_tags_whose_node_is_not_reserved_holds_the_stop_for_the_sweep(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given rank 7's RUNNING event was lost, When a fault stops the gang and the reservation of
    rank 7's node (found by its tags) fails twice, Then no rank is stopped (a stop would free
    rank 7's node unmarked: any scheduler could take it); the sweep's stop a minute on reserves
    it first, then stops every rank. Before, the failed reservation was logged and the stop went
    out, rank 7's node free and unmarked."""
    from gpu_recovery.repository.cordons import CordonRepository

    failing = {"on": True}
    set_holds = CordonRepository.set_holds

    def throttled_for_node_7(self: CordonRepository, read: Any, changes: Any, *args: Any, **kw: Any) -> Any:
        if failing["on"] and "node-007" in changes:
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}},
                              "TransactWriteItems")
        return set_holds(self, read, changes, *args, **kw)

    monkeypatch.setattr(CordonRepository, "set_holds", throttled_for_node_7)
    with world(gang_queue=True) as w:
        nodes = _nodes(WORLD)
        arns = w.register_job("big", nodes)
        lost = w.lose_registration("big", 7, nodes[7], world_size=WORLD)
        at_stop = w.unavailable_at_stop(nodes[7:8])
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        w.drain_queue()
        assert w.ecs.tag_lookups == 1 and w.ecs.stop_calls == []
        assert w.repo.jobs.get_rank("big", 7) is not None  # registered: the sweep finds it so
        failing["on"] = False
        w.advance(60)
        w.service.sweep()
        w.drain_queue()
        assert lost in w.ecs.stop_calls and len(set(w.ecs.stop_calls)) == WORLD - 1
        assert all(seen[nodes[7]] for seen in at_stop.values())  # reserved before any stop


def test_a_rank_found_by_its_tags_on_a_node_its_peers_hold_is_stopped_with_them_at_once() -> None:
    """Given two ranks a node and rank 7's RUNNING event lost (rank 6, on the same node, known),
    When a fault stops the gang, Then rank 7 is found by its tags and stopped with the others by
    the same invocation: its node was in the reservation this invocation just put (its own note
    that it puts it does not hold its own stop back for the sweep)."""
    with world(gang_queue=True) as w:
        nodes = [f"node-{i // 2:03d}" for i in range(WORLD)]
        arns = w.register_job("big", nodes)
        lost = w.lose_registration("big", 7, nodes[7], world_size=WORLD)
        w.repo.tables.db.table(w.repo.tables.job_table_name).update_item(  # rank 6's node, known
            Key={C.JOB_PK: C.latch_shard_key("big", 1, 0)}, UpdateExpression="ADD #n :node",
            ExpressionAttributeNames={"#n": "nodes"}, ExpressionAttributeValues={":node": {nodes[6]}})
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        w.drain_queue()
        assert w.ecs.tag_lookups == 1 and lost in w.ecs.stop_calls
        assert len(set(w.ecs.stop_calls)) == WORLD - 1


def test_a_rank_never_registered_and_stopped_is_found_when_its_lookup_fails_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Given rank 7's RUNNING and STOPPED events both lost (its task stopped), When a fault stops
    the gang and the lookup's first read fails (throttled), Then it is tried again at once: rank
    7 is found among the stopped tasks, its node reserved before any rank is stopped, and the
    stop goes out in the same invocation, not a minute later at the sweep (soak seed 7157: the
    scheduler took the node 14 s after such a failure)."""
    with world(gang_queue=True) as w:
        nodes = _nodes(WORLD)
        arns = w.register_job("big", nodes)
        lost = w.lose_registration("big", 7, nodes[7], world_size=WORLD)
        w.ecs.tasks[lost].last_status = "STOPPED"
        w.ecs.tagged_tasks[-1]["lastStatus"] = "STOPPED"
        at_stop = w.unavailable_at_stop(nodes[7:8])
        failed = throttle_once(monkeypatch, LatchRepository, "registered", "BatchGetItem")
        w.service.on_task_state_change(w.task_stopped(arns[-1], exit_code=1))
        assert failed  # the lookup's first read throttled
        w.drain_queue()
        assert w.repo.jobs.get_rank("big", 7) is not None and w.ecs.tag_lookups == 1
        assert len(set(w.ecs.stop_calls)) >= WORLD - 2 and at_stop
        assert all(seen[nodes[7]] for seen in at_stop.values())  # reserved before any stop


def _lose_verdicts(w: World, nodes: list[str]) -> None:
    """Every running DCGM check ends, its STOPPED event lost (or its verdict gave up)."""
    for node in nodes:
        for task in w.ecs.health_checks_on(node):
            if task.last_status == "RUNNING":
                task.last_status, task.exit_code = "STOPPED", 0


def _verdicts_counted(w: World, job_id: str, attempt: int = 1) -> int:
    """The fault's verdicts counted: on the job item and on the tally's shards."""
    job = w.repo.jobs.get_job(job_id)
    tables = w.repo.tables
    shards = [tables.db.get(tables.job_table_name, {C.JOB_PK: C.fault_tally_shard_key(job_id, attempt, s)})
              for s in range(tally_shard_count(job.world_size))]
    return job.tally.decided + sum(len((i or {}).get("decided_nodes") or ()) for i in shards)


# Slow tier (CI runs it: make test-slow): a whole emulated fan-out (~4-8 s); the other
# fan-out tests here (large gangs, batches of ten, lookups by tags) stay in make test.
@pytest.mark.slow
def test_one_sweep_works_through_more_due_items_than_a_page(monkeypatch: Any) -> None:
    """Hundreds of verdicts that lost their races to one job's tally are left to the sweep's
    poll: one sweep reads page after page (within its budget), not one page a minute."""
    monkeypatch.setattr(sweep_mod, "DUE_PAGE", 3)
    with world(max_app_restarts=1, check_all_nodes_on_fault=True) as w:  # every exit a suspect
        nodes = _nodes(10)
        arns = w.register_job("j", nodes)
        for arn in arns:  # an NCCL cascade: every node a suspect
            w.service.on_task_state_change(w.task_stopped(arn, exit_code=1))
        _lose_verdicts(w, nodes)
        w.advance(HEALTH_CHECK_POLL_SECONDS + 1)
        w.service.sweep()
        job = w.repo.jobs.get_job("j")
        assert _verdicts_counted(w, "j") == 10, "one sweep polls every due check, 3 per page"
        assert job.state in (JobState.STARTING, JobState.RUNNING)


# Slow tier (CI runs it: make test-slow): a whole emulated fan-out (~4-8 s); the other
# fan-out tests here (large gangs, batches of ten, lookups by tags) stay in make test.
@pytest.mark.slow
def test_a_sweep_short_of_time_leaves_the_rest_for_the_next(monkeypatch: Any) -> None:
    monkeypatch.setattr(sweep_mod, "DUE_PAGE", 3)
    with world(max_app_restarts=1, check_all_nodes_on_fault=True) as w:  # every exit a suspect
        nodes = _nodes(10)
        arns = w.register_job("j", nodes)
        for arn in arns:
            w.service.on_task_state_change(w.task_stopped(arn, exit_code=1))
        _lose_verdicts(w, nodes)
        w.advance(HEALTH_CHECK_POLL_SECONDS + 1)
        budget = iter([60.0] * 3 + [1.0] * 1000)  # time for two steps, then out of time
        outcome = w.service.sweep(lambda: next(budget))
        assert _verdicts_counted(w, "j") < 10
        assert outcome.detail["handled"].get("deferred_to_next_sweep", 0) > 0
        w.service.sweep()  # the next minute's sweep finishes them
        assert _verdicts_counted(w, "j") == 10


def test_a_jobs_share_as_large_as_the_clusters_is_not_counted() -> None:
    """The per-job share can never bind when it is at least the cluster's limit: no share
    item is written (one hot item less per claim and verdict), the cluster's count stays
    exact, and every check is released."""
    with world(max_health_checks_per_job=64, max_health_checks_in_flight=64, max_app_restarts=1,
               check_all_nodes_on_fault=True) as w:
        nodes = _nodes(5)
        arns = w.register_job("j", nodes)
        for arn in arns:
            w.service.on_task_state_change(w.task_stopped(arn, exit_code=1))
        assert w.repo.slots.running() == 5
        tables = w.repo.tables
        assert tables.db.get(tables.job_table_name, {C.JOB_PK: C.health_check_slots_key("j")}) is None
        for node in nodes:
            _verdict(w, node, 0)
        assert w.repo.slots.running() == 0
        assert w.repo.jobs.get_job("j").state in (JobState.STARTING, JobState.RUNNING)


def test_a_refused_start_task_gives_its_leases_back_to_the_redelivery() -> None:
    """Given a restart batch whose first StartTask (ranks 0-9) ECS refused (throttled)
    When SQS delivers the batch again a second later
    Then it takes those ranks' leases (given back: the refused call started nothing), looks
    their tasks up and starts them: the job RUNNING. The leases were held until they ran out, two
    minutes and more a failure (8 % sweeps: fast_path s123 and s173, a job PENDING_RESTART for 16
    and 22 minutes, its StartTasks never sent: the ECS budget's write failed; the same case)."""
    with world(gang_queue=True, max_app_restarts=1) as w:
        _first_start_fails(w, "refuse")
        batch = [body for body, _ in w.queue.messages]
        with pytest.raises(ClientError):
            w.drain_queue()
        w.advance(1)
        for body in batch:
            w.service.on_gang_batch(body, receive_count=2)
        assert w.repo.jobs.get_job("big").state is JobState.RUNNING
        assert w.ecs.start_calls == [10, 10, 10, 10, 10]


def test_a_take_over_whose_look_up_failed_gives_its_leases_back_to_the_redelivery() -> None:
    """Given a restart batch whose first StartTask's answer was lost (ranks 0-9 started, their
    leases kept), then the sweep's resend once those leases ran out, whose look-up of the tasks
    by startedBy (ListTasks) is throttled
    When SQS delivers that batch again at once
    Then it takes the leases (given back: the failed try started nothing), finds the ten tasks
    and registers them: the job RUNNING, no StartTask more. A failed look-up held its leases
    until they ran out, so each failure cost the rank's start two more minutes (8 % sweeps:
    fast_path s123, preflight_forged_loopback s147, a rank started 16 minutes late)."""
    with world(gang_queue=True, max_app_restarts=1) as w:
        _first_start_fails(w, "lose")
        with pytest.raises(LostResponse):
            w.drain_queue()
        w.advance(RESEND_AFTER_SECONDS)
        w.service.sweep()
        batch = [body for body, _ in w.queue.messages]
        w.ecs.failures["tasks_started_by"] = ["refuse"]
        with pytest.raises(ClientError):
            w.drain_queue()
        assert w.repo.jobs.get_job("big").state is JobState.STARTING
        w.advance(1)
        for body in batch:
            w.service.on_gang_batch(body, receive_count=2)
        assert w.repo.jobs.get_job("big").state is JobState.RUNNING
        assert w.ecs.start_calls == [10, 10, 10, 10]
