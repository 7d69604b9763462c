"""Issue 28: a duplicate delivery of a health check's STOPPED event waits for the verdict's
lease instead of racing its transaction (``HealthChecks.on_stopped`` with the invocation;
``repository.verdict_leases``). The recovery with fakes of the ports, and the repository on
the in-memory DynamoDB."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpu_recovery import clock
from gpu_recovery import constants as C
from gpu_recovery.domain.states import InstanceState, JobState
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.recovery import Invocation
from gpu_recovery.recovery.verdict_lease import LEASE_READS, VERDICT_LEASE_SECONDS, lease_end
from gpu_recovery.repository.verdict_leases import VERDICT_LEASE_TTL_SECONDS
from tests.fixtures.memory_repository import JOBS, T0, memory_repository
from tests.recovery.fakes import LostResponse, World, world

PEER, FAULTY = "node-a", "node-b"
TIMEOUT = 60.0  # the DCGM monitor's function timeout


def _check_stopped(w: World) -> EcsTaskDetail:
    """Rank 1 exits 1: node-b's DCGM check runs, and stops saying reboot."""
    arns = w.register_job("j", [PEER, FAULTY])
    w.service.on_task_state_change(w.task_stopped(arns[1], exit_code=1))
    [task] = w.ecs.health_checks_on(FAULTY)
    return w.health_check_stopped(task, 1)


def _count_decisions(w: World) -> list[int]:
    """How many node decisions (the verdict's transaction) were written, as they are."""
    real = w.repo._repo.decisions
    decide = real.record
    count = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return decide(*args, **kwargs)

    real.record = counted
    return count


def _sleeper(w: World, on_first: Callable[[], None] | None = None) -> list[float]:
    """The clock's sleep: advances the world's time; ``on_first`` runs in the first pause
    (what another invocation does meanwhile). Returns the pauses taken."""
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 1 and on_first is not None:
            on_first()
        w.advance(seconds)

    clock.set_clock(lambda: w.now[0], sleep)
    return pauses


def _rebooted(w: World) -> None:
    assert w.repo.instances.get_instance(FAULTY).state is InstanceState.REBOOTING
    assert w.repo.jobs.get_job("j").state is JobState.PENDING_RESTART
    assert w.rebooter.calls == [f"i-{FAULTY}"]


def test_two_copies_interleaved_make_one_transaction_and_the_second_waits() -> None:
    """Given copy A of the STOPPED event took the verdict's lease and is working it
    When copy B (its own invocation) arrives meanwhile
    Then B waits (no transaction of its own), A's verdict lands, and B converges on it."""
    with world() as w:
        detail = _check_stopped(w)
        decisions = _count_decisions(w)
        a = Invocation("req-a", w.now[0] + TIMEOUT)
        leases = w.repo.verdict_leases
        assert leases.claim(detail.taskArn, a.request_id, lease_end(a, w.now[0]), w.now[0]).taken
        finished: list[str] = []
        pauses = _sleeper(w, lambda: finished.append(w.service.on_health_check_stopped(detail, a).action))
        b = Invocation("req-b", w.now[0] + 0.3 + TIMEOUT)
        outcome = w.service.on_health_check_stopped(detail, b)
        assert finished == ["verdict_applied"]  # A, while B waited
        assert outcome.action != "verdict_applied" and len(pauses) == 1
        assert decisions[0] == 1  # one transaction: B never built its own
        _rebooted(w)


def test_a_holder_that_died_after_the_lease_is_finished_by_lambdas_retry() -> None:
    """Given the invocation that took the lease failed before its verdict
    When Lambda retries it (the same request id) before the lease expired
    Then the retry passes the lease at once and applies the verdict."""
    with world() as w:
        detail = _check_stopped(w)
        died = Invocation("req-a", w.now[0] + TIMEOUT)
        assert w.repo.verdict_leases.claim(detail.taskArn, died.request_id, died.deadline, w.now[0]).taken
        w.advance(TIMEOUT + 1)  # its failure, then Lambda's retry a minute on
        pauses = _sleeper(w)
        retry = Invocation("req-a", w.now[0] + TIMEOUT)
        assert w.service.on_health_check_stopped(detail, retry).action == "verdict_applied"
        assert pauses == []
        _rebooted(w)


def test_a_lost_answer_on_the_lease_write_is_passed_by_the_retry() -> None:
    """Given the lease's PutItem was written but its answer lost (the invocation failed)
    When the same invocation is retried
    Then the lease is its own and the verdict is applied."""
    with world() as w:
        detail = _check_stopped(w)
        pauses = _sleeper(w)
        a = Invocation("req-a", w.now[0] + TIMEOUT)
        w.repo.fail_once("verdict_leases.claim", "lose")
        with pytest.raises(LostResponse):
            w.service.on_health_check_stopped(detail, a)
        assert w.repo.instances.get_instance(FAULTY).state is InstanceState.HEALTH_CHECKING
        assert w.service.on_health_check_stopped(detail, a).action == "verdict_applied"
        assert pauses == []
        _rebooted(w)


def test_another_copy_takes_over_an_expired_lease() -> None:
    """Given the lease's holder died and its lease expired
    When a different copy of the event arrives
    Then it takes the lease over and applies the verdict, without waiting."""
    with world() as w:
        detail = _check_stopped(w)
        assert w.repo.verdict_leases.claim(detail.taskArn, "req-a", w.now[0] + TIMEOUT, w.now[0]).taken
        w.advance(TIMEOUT + 0.5)
        pauses = _sleeper(w)
        assert w.service.on_health_check_stopped(detail, Invocation("req-b", w.now[0] + TIMEOUT)).action \
            == "verdict_applied"
        assert pauses == []
        _rebooted(w)


def test_a_waiting_copy_takes_over_once_the_dead_holders_lease_expires() -> None:
    """Given the holder died with its (short) lease running for a few seconds more
    When another copy with 60 s left arrives
    Then it pauses until the lease expires (one read, not a poll every second), takes it
    over and applies the verdict."""
    with world() as w:
        detail = _check_stopped(w)
        assert w.repo.verdict_leases.claim(detail.taskArn, "req-a", w.now[0] + 8, w.now[0]).taken
        start = w.now[0]
        pauses = _sleeper(w)
        outcome = w.service.on_health_check_stopped(detail, Invocation("req-b", start + TIMEOUT))
        assert outcome.action == "verdict_applied"
        assert 8 < w.now[0] - start <= 9 and len(pauses) == 1
        _rebooted(w)


def test_a_lease_taken_by_an_invocation_that_died_expires_seconds_later_not_at_its_deadline() -> None:
    """Issue 49: an invocation took the lease, then died working the verdict (its deadline
    a minute on). Another copy arriving VERDICT_LEASE_SECONDS later takes the lease over at
    once: the lease lasts that long unless its holder renews it."""
    with world() as w:
        detail = _check_stopped(w)
        died = Invocation("req-a", w.now[0] + TIMEOUT)
        health = w.service.health.verdicts

        def die(*args: object, **kwargs: object) -> None:
            raise RuntimeError("the invocation died")

        health._apply = die  # type: ignore[method-assign]
        _sleeper(w)
        with pytest.raises(RuntimeError):
            w.service.on_health_check_stopped(detail, died)
        del health._apply
        item = w.repo._repo.tables.db.get("jobs", {C.JOB_PK: C.verdict_lease_key(detail.taskArn)})
        assert item is not None and float(item["lease_until"]) <= w.now[0] + VERDICT_LEASE_SECONDS
        w.advance(VERDICT_LEASE_SECONDS + 1)
        pauses = _sleeper(w)
        assert w.service.on_health_check_stopped(detail, Invocation("req-b", w.now[0] + TIMEOUT)).action \
            == "verdict_applied"
        assert pauses == []
        _rebooted(w)


def test_a_copy_finding_the_lease_held_reads_a_few_times_then_leaves_it_to_the_sweep() -> None:
    """Issue 49 (one invocation made 232 GetItem calls polling the instance): given the
    holder keeps its lease (renewing it) past the copy's time, the copy reads the instance
    at most LEASE_READS times, writes nothing of the verdict, does not fail, and brings the
    sweep's poll of the check forward to just after the lease."""
    with world() as w:
        detail = _check_stopped(w)
        decisions = _count_decisions(w)
        start = w.now[0]
        holder = Invocation("req-a", start + TIMEOUT)

        def renewing() -> None:  # the holder, alive, renews whenever the copy looks
            until = min(holder.deadline, w.now[0] + VERDICT_LEASE_SECONDS)
            assert w.repo.verdict_leases.claim(detail.taskArn, holder.request_id, until, w.now[0]).taken

        renewing()
        reads = [0]
        real_get = w.repo._repo.instances.get_instance_item

        def counted_get(inst_id: str) -> object:
            reads[0] += 1
            renewing()
            return real_get(inst_id)

        w.repo._repo.instances.get_instance_item = counted_get
        _sleeper(w)
        outcome = w.service.on_health_check_stopped(detail, Invocation("req-b", start + TIMEOUT))
        w.repo._repo.instances.get_instance_item = real_get
        assert outcome.action == "verdict_lease_held"
        assert reads[0] <= LEASE_READS + 1  # the event's first read, then the bounded looks
        assert w.now[0] - start <= TIMEOUT - 10  # inside its budget, with its margin
        assert decisions[0] == 0 and w.rebooter.calls == []
        instance = w.repo.instances.get_instance(FAULTY)
        assert instance.state is InstanceState.HEALTH_CHECKING and instance.check.task_arn == detail.taskArn
        assert instance.deadline_at is not None
        assert instance.deadline_at <= w.now[0] + VERDICT_LEASE_SECONDS + 6


def test_without_an_invocation_the_verdict_takes_no_lease() -> None:
    """Given the sweep reading a lost STOPPED event (no Lambda context of the event)
    When it applies the verdict
    Then it writes no lease item (the transaction's conditions keep the verdict single)."""
    with world() as w:
        detail = _check_stopped(w)
        assert w.service.on_health_check_stopped(detail).action == "verdict_applied"
        assert w.repo._repo.tables.db.get("jobs", {C.JOB_PK: C.verdict_lease_key(detail.taskArn)}) is None
        _rebooted(w)


def test_the_lease_is_taken_kept_by_its_holder_and_refused_to_others_until_it_expires() -> None:
    """The repository's intent on the in-memory DynamoDB: botocore's retry of the same
    PutItem (the same holder) passes; another holder learns when the lease expires; after
    it, the other takes it; the item carries the job table's TTL a day on."""
    repo = memory_repository()
    task = "arn:aws:ecs:us-east-1:111122223333:task/cluster/0123abcd"
    assert repo.verdict_leases.claim(task, "req-a", T0 + 60, T0).taken
    assert repo.verdict_leases.claim(task, "req-a", T0 + 60, T0 + 0.2).taken  # the same PutItem again
    other = repo.verdict_leases.claim(task, "req-b", T0 + 61, T0 + 1)
    assert not other.taken and other.until == T0 + 60
    assert not repo.verdict_leases.claim(task, "req-b", T0 + 61, T0 + 60).taken  # not yet past it
    assert repo.verdict_leases.claim(task, "req-b", T0 + 121, T0 + 60.5).taken
    item = repo.tables.db.get(JOBS, {C.JOB_PK: "VERDICT#0123abcd"})
    assert item is not None and item["holder"] == "req-b" and float(item["lease_until"]) == T0 + 121
    assert int(item[C.JOB_TABLE_TTL_ATTRIBUTE]) == int(T0 + 60.5 + VERDICT_LEASE_TTL_SECONDS)
