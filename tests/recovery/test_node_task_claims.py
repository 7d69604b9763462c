"""The stored claim of a node task (``repository.node_task_claims``), for every kind: each
write holds only for the claim it names and for what the claim serves (a GPU reset's node
decision, a validation's ``since``, the health check its node is in), so a late or repeated
delivery never moves a newer claim."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from gpu_recovery import constants as C
from gpu_recovery.domain.models import NO_CLAIM, Instance
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.repository import claim_fields as stored
from gpu_recovery.repository.base import to_ddb
from gpu_recovery.repository.claim_fields import ClaimFields
from tests.recovery.fakes import World, world

NODE = "node-a"


def node(w: World, **fields: Any) -> Instance:
    """NODE as REBOOTING with ``fields`` (a GPU reset pending, or a validation map)."""
    item = {C.INSTANCE_PK: NODE, "instance_state": InstanceState.REBOOTING.value, **fields}
    boto3.resource("dynamodb", region_name="us-east-1").Table("instances").put_item(Item=to_ddb(item))
    return read(w)


def the_claim(fields: ClaimFields, instance: Instance | None) -> tuple[str, float, str]:
    """The claim's startedBy, claim time (0.0: none) and task, as ``instance`` holds it."""
    assert instance is not None
    claim = fields.read(instance)
    return claim.started_by, claim.claimed_at or 0.0, claim.task_arn


def read(w: World) -> Instance:
    instance = w.repo.instances.get_instance(NODE)
    assert instance is not None
    return instance


def resetting(w: World, **claim: Any) -> Instance:
    return node(w, reboot_requested_at=w.now[0] - 60, reset_pending=True, **claim)


def validating(w: World, **claim: Any) -> Instance:
    return node(w, validation={"since": w.now[0] - 60, "until": w.now[0] + 3600, "attempts": 1, **claim})


KINDS = [pytest.param(stored.GPU_RESET, resetting, id="gpu_reset"),
         pytest.param(stored.VALIDATION, validating, id="validation")]


@pytest.mark.parametrize(("fields", "make"), KINDS)
def test_one_claimer_wins_and_a_dead_claim_is_taken_over_once(fields: ClaimFields, make: Any) -> None:
    with world() as w:
        unclaimed = make(w)
        now = w.now[0]
        assert w.repo.node_tasks.claim(fields, unclaimed, "claim-1", now, now + 60, "tok-1")
        assert not w.repo.node_tasks.claim(fields, unclaimed, "claim-2", now, now + 60, "tok-2")  # the loser
        claimed = read(w)
        assert the_claim(fields, claimed) == ("claim-1", now, "")
        w.advance(600)
        assert w.repo.node_tasks.take_over(fields, claimed, w.now[0], w.now[0] + 60, "tok-3")
        # read before:
        assert not w.repo.node_tasks.take_over(fields, claimed, w.now[0], w.now[0] + 60, "tok-4")
        assert the_claim(fields, read(w)) == ("claim-1", w.now[0], "")


@pytest.mark.parametrize(("fields", "make"), KINDS)
def test_a_claim_written_whose_answer_was_lost_passes_again_for_its_own_try_alone(fields: ClaimFields,
                                                                                  make: Any) -> None:
    """Given a claim (and later a take-over) written but whose answer was lost, When the same
    try sends it again (its token), Then it passes; a concurrent delivery's own try (another
    token, the same startedBy) does not, so two tries never both start the task."""
    with world() as w:
        unclaimed = make(w)
        now = w.now[0]
        assert w.repo.node_tasks.claim(fields, unclaimed, "claim-1", now, now + 60, "tok-a")
        assert w.repo.node_tasks.claim(fields, unclaimed, "claim-1", now, now + 60, "tok-a")  # sent again
        assert not w.repo.node_tasks.claim(fields, unclaimed, "claim-1", now, now + 60, "tok-b")
        claimed = read(w)
        w.advance(600)
        assert w.repo.node_tasks.take_over(fields, claimed, w.now[0], w.now[0] + 60, "tok-c")
        assert w.repo.node_tasks.take_over(fields, claimed, w.now[0], w.now[0] + 60, "tok-c")
        assert not w.repo.node_tasks.take_over(fields, claimed, w.now[0], w.now[0] + 60, "tok-d")
        assert not w.repo.node_tasks.claim(fields, claimed, "claim-1", now, now + 60, "tok-a")  # taken over
        assert the_claim(fields, read(w)) == ("claim-1", w.now[0], "")
        assert w.repo.node_tasks.release(fields, read(w), "claim-1", w.now[0] + 60)
        assert w.repo.node_tasks.claim(fields, read(w), "claim-2", w.now[0], w.now[0] + 60, "tok-e")


@pytest.mark.parametrize(("fields", "make"), KINDS)
def test_a_recorded_task_is_the_claim_s_and_is_never_released_as_not_started(fields: ClaimFields,
                                                                                make: Any) -> None:
    with world() as w:
        now = w.now[0]
        claimed = make(w)
        assert w.repo.node_tasks.claim(fields, claimed, "claim-1", now, now + 60, "tok-5")
        claimed = read(w)
        assert not w.repo.node_tasks.record(fields, claimed, "claim-other", "arn:task", now + 120)
        assert w.repo.node_tasks.record(fields, claimed, "claim-1", "arn:task", now + 120)
        running = read(w)
        assert fields.read(running).task_arn == "arn:task" and running.deadline_at == now + 120
        # A start whose answer came late says "not placed": the recorded task stays.
        assert not w.repo.node_tasks.release(fields, running, "claim-1", now + 60)
        assert the_claim(fields, read(w)) == ("claim-1", now, "arn:task")


def test_a_task_ended_without_a_verdict_gives_the_validation_s_claim_back_as_an_attempt() -> None:
    with world() as w:
        now = w.now[0]
        running = validating(w, started_by="claim-1", claimed_at=now, task_arn="arn:task")
        assert w.repo.node_tasks.release(stored.VALIDATION, running, "claim-1", now + 60, attempt_used=True)
        released = read(w)
        assert the_claim(stored.VALIDATION, released) == ("", 0.0, "")
        assert released.validation["attempts"] == 2 and released.validation["since"] == now - 60
        assert released.deadline_at == now + 60


def test_a_refused_start_gives_the_reset_s_claim_back_without_counting() -> None:
    with world() as w:
        now = w.now[0]
        claimed = resetting(w, reset_started_by="claim-1", reset_claimed_at=now)
        assert w.repo.node_tasks.release(stored.GPU_RESET, claimed, "claim-1", now + 60)
        assert the_claim(stored.GPU_RESET, read(w)) == ("", 0.0, "")


@pytest.mark.parametrize(("fields", "make", "moved_on"), [
    pytest.param(stored.GPU_RESET, resetting,
                 lambda w, before: node(w, reboot_requested_at=w.now[0], reset_pending=True),
                 id="a newer decision"),
    pytest.param(stored.GPU_RESET, resetting,
                 lambda w, before: node(w, reboot_requested_at=before.reboot_requested_at),
                 id="the reset fell back to a reboot"),
    pytest.param(stored.VALIDATION, validating, lambda w, before: node(w, validation={"since": w.now[0]}),
                 id="a newer validation"),
])
def test_no_write_holds_once_what_the_claim_served_moved_on(fields: ClaimFields, make: Any,
                                                            moved_on: Any) -> None:
    with world() as w:
        now = w.now[0]
        before = make(w)
        moved_on(w, before)
        assert not w.repo.node_tasks.claim(fields, before, "claim-1", now, now + 60, "tok-6")
        assert not w.repo.node_tasks.rearm(fields, before, now + 60)
        assert fields.read(read(w)).started_by == ""


def checking(w: World, **claim: Any) -> Instance:
    """NODE in its health check, claimed by ``claim-1`` (its lease apart from its claim time)."""
    item = {C.INSTANCE_PK: NODE, "instance_state": InstanceState.HEALTH_CHECKING.value,
            "hc_started_by": "claim-1", "hc_claimed_at": w.now[0], "hc_lease_until": w.now[0] + 75, **claim}
    boto3.resource("dynamodb", region_name="us-east-1").Table("instances").put_item(Item=to_ddb(item))
    return read(w)


def test_a_health_check_s_dead_claim_is_taken_over_once_its_lease_ends_and_keeps_its_time() -> None:
    """The check's time runs from its claim: a take-over renews the lease kept apart, never
    ``hc_claimed_at``; one taker wins; a recorded task ends the lease and is never taken over."""
    with world() as w:
        claimed_at = w.now[0]
        held = checking(w)
        # leased:
        assert not w.repo.node_tasks.take_over(stored.HEALTH_CHECK, held, w.now[0], w.now[0] + 75, "tok-7")
        w.advance(100)
        assert w.repo.node_tasks.take_over(stored.HEALTH_CHECK, held, w.now[0], w.now[0] + 75, "tok-8")
        # the loser:
        assert not w.repo.node_tasks.take_over(stored.HEALTH_CHECK, held, w.now[0], w.now[0] + 75, "tok-9")
        taken = read(w)
        assert the_claim(stored.HEALTH_CHECK, taken) == ("claim-1", claimed_at, "")
        assert taken.check.lease_until == w.now[0] + 75 and taken.deadline_at == w.now[0] + 75
        assert not w.repo.node_tasks.record(stored.HEALTH_CHECK, taken, "claim-2", "arn:hc", w.now[0] + 300)
        assert w.repo.node_tasks.record(stored.HEALTH_CHECK, taken, "claim-1", "arn:hc", w.now[0] + 300)
        running = read(w)
        assert the_claim(stored.HEALTH_CHECK, running) == ("claim-1", claimed_at, "arn:hc")
        assert running.check.lease_until is None and running.deadline_at == w.now[0] + 300
        w.advance(600)
        assert not w.repo.node_tasks.take_over(stored.HEALTH_CHECK, running, w.now[0], w.now[0] + 75,
                                               "tok-10")


def test_no_health_check_claim_write_holds_once_the_node_left_its_check() -> None:
    """A verdict (or a released claim) moved the node on: a late delivery records nothing."""
    with world() as w:
        held = checking(w)
        node(w)  # the verdict: REBOOTING
        w.advance(100)
        assert not w.repo.node_tasks.take_over(stored.HEALTH_CHECK, held, w.now[0], w.now[0] + 75, "tok-11")
        assert not w.repo.node_tasks.record(stored.HEALTH_CHECK, held, "claim-1", "arn:hc", w.now[0] + 300)
        assert read(w).state is InstanceState.REBOOTING and read(w).check.task_arn == ""


def test_a_health_check_s_claim_given_back_returns_the_node_to_pending_and_counts_as_its_kind_says() -> None:
    """Not placed: the claim goes (its lease with it), the attempt counted; refused: not
    counted; a recorded task is never given back as not started; a check that ended without a
    verdict is given back as a used attempt, its task with it."""
    with world() as w:
        now = w.now[0]
        assert w.repo.health_checks.release_claim(checking(w, hc_start_attempts=1), "claim-1",
                                                 placement_failed=True, retry_at=now + 60)
        released = read(w)
        assert released.state is InstanceState.HEALTH_CHECK_PENDING and released.check.attempts == 2
        assert the_claim(stored.HEALTH_CHECK, released) == ("", 0.0, "")
        assert released.check.lease_until is None
        assert released.deadline_at == now + 60
        assert w.repo.health_checks.release_claim(checking(w, hc_start_attempts=1), "claim-1",
                                                 placement_failed=False, retry_at=now + 60)
        assert read(w).check.attempts == 1
        running = checking(w, hc_start_attempts=1, hc_task_arn="arn:hc")
        assert not w.repo.health_checks.release_claim(running, "claim-1", placement_failed=True, retry_at=now)
        assert not w.repo.health_checks.retry(running, "claim-2", now + 60)  # another claim's
        assert w.repo.health_checks.retry(running, "claim-1", now + 60)
        retried = read(w)
        assert retried.state is InstanceState.HEALTH_CHECK_PENDING and retried.check.attempts == 2
        assert the_claim(stored.HEALTH_CHECK, retried) == ("", 0.0, "")


def test_a_validation_passes_only_on_its_own_claim_which_must_exist() -> None:
    """A pass is its task's result: with no claim read (nothing ran) or another claim's, it
    does not land; on its own claim the node is AVAILABLE."""
    with world() as w:
        unclaimed = validating(w)
        assert not w.repo.validations.pass_validation(unclaimed, {"result": "passed"}, w.now[0])
        stale = validating(w, started_by="claim-1", claimed_at=w.now[0], task_arn="arn:task")
        validating(w, started_by="claim-2", claimed_at=w.now[0], task_arn="arn:task-2")  # a new attempt's
        assert not w.repo.validations.pass_validation(stale, {"result": "passed"}, w.now[0])
        assert read(w).state is InstanceState.REBOOTING
        assert w.repo.validations.pass_validation(read(w), {"result": "passed"}, w.now[0])
        assert read(w).state is InstanceState.AVAILABLE


def test_a_new_kind_is_one_declaration_its_claim_read_the_one_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a fourth kind (a NIC check) declared only where its claim is stored, listed in
    KINDS, When its claim is made, its task recorded and the claim given back, Then the node
    read back holds it in ``Instance.tasks`` under its kind, beside the others', with nothing
    added to the instance's model or to the item's reader."""
    nic = ClaimFields("nic_check", "nic_started_by", "nic_claimed_at", "nic_task_arn", "nic_claim_token",
                      lambda _: ("", {}, {}))
    monkeypatch.setattr(stored, "KINDS", (*stored.KINDS, nic))
    with world() as w:
        now = w.now[0]
        instance = resetting(w, reset_started_by="claim-r", reset_claimed_at=now - 5)
        assert instance.task("nic_check") == NO_CLAIM
        assert w.repo.node_tasks.claim(nic, instance, "claim-n", now, now + 75, "tok-12")
        assert w.repo.node_tasks.record(nic, read(w), "claim-n", "arn:nic", now + 120)
        assert the_claim(nic, read(w)) == ("claim-n", now, "arn:nic")
        assert the_claim(stored.GPU_RESET, read(w)) == ("claim-r", now - 5, "")
        assert w.repo.node_tasks.release(nic, read(w), "claim-n", now + 60, attempt_used=True)
        assert set(read(w).tasks) == {"gpu_reset"}
