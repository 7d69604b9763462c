"""The one way a node task starts (``recovery.node_tasks``), for every kind the stack runs
on a node, with the stages' fakes: what StartTask is asked, and what the claim owes each
answer (recorded, given back, kept until its lease expires). The stages' own tests
(test_stages.py, test_gpu_resets.py, test_validations.py) run it inside their flows."""

from __future__ import annotations

import boto3
import pytest

from gpu_recovery import constants as C
from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.constants import RETRY_INTERVAL_SECONDS
from gpu_recovery.domain.models import (
    GPU_RESET_TASK,
    HEALTH_CHECK_TASK,
    NO_CLAIM,
    VALIDATION_TASK,
    Instance,
    TaskClaim,
)
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.recovery import node_tasks
from gpu_recovery.recovery.node_tasks import NodeTaskKind
from gpu_recovery.recovery.task_starts import started_already
from gpu_recovery.repository import claim_fields as stored
from gpu_recovery.repository.base import to_ddb
from gpu_recovery.repository.claim_fields import ClaimFields
from gpu_recovery.repository.records import instance_from_item
from tests.recovery.fakes import LostResponse, World, world

KINDS = [node_tasks.HEALTH_CHECK, node_tasks.GPU_RESET, node_tasks.VALIDATION]


class Claim:
    """What the stage's callbacks were told."""

    def __init__(self) -> None:
        self.released = 0
        self.recorded: list[str] = []

    def release(self) -> None:
        self.released += 1

    def record(self, task_arn: str) -> None:
        self.recorded.append(task_arn)


def start(w: World, kind: NodeTaskKind, claim: Claim, **kwargs: object) -> node_tasks.Placed:
    return w.service.node_tasks.start(kind, Instance("node-a"), "claim-1", release=claim.release,
                                      record=claim.record, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_a_placed_task_is_recorded_with_its_kind_s_group_and_tag(kind: NodeTaskKind) -> None:
    with world() as w:
        claim = Claim()
        placed = start(w, kind, claim, environment={"DCGM_LEVEL": "3"})
        [task] = w.ecs.tasks.values()
        assert placed.task_arn == task.arn and claim.recorded == [task.arn] and claim.released == 0
        assert (task.node, task.started_by, task.group) == ("node-a", "claim-1", kind.group)
        assert kind.group.startswith(node_tasks.HEALTH_CHECK.group)  # routed to the check's handler
        assert started_already(w.ecs, "claim-1", ["node-a"]) == {"node-a": task.arn}


class Counted:
    def __init__(self) -> None:
        self.added: list[str] = []

    def add_metric(self, name: str, unit: str, value: float) -> None:
        self.added.append(name)

    def add_metric_now(self, name: str, unit: str, value: float) -> None:
        self.added.append(name)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_a_start_counts_in_the_metrics_of_the_invocation_running_now(kind: NodeTaskKind) -> None:
    """The component is built once per service; each invocation points the service's metrics
    at its own (runtime.recovery_service), and the component's start counts there."""
    with world() as w:
        first, second = Counted(), Counted()
        w.service.metrics = first
        start(w, kind, Claim())
        w.service.metrics = second
        w.ecs.tasks.clear()
        start(w, kind, Claim())
        assert first.added == [kind.started_metric] and second.added == [kind.started_metric]
        assert w.service.metrics is second


def test_each_kind_is_its_own_group_purpose_and_metric() -> None:
    for field in ("group", "purpose", "started_metric"):
        assert len({getattr(kind, field) for kind in KINDS}) == len(KINDS), field


def test_only_a_kind_with_a_container_hands_it_an_environment() -> None:
    seen: list[object] = []
    with world() as w:
        original = w.ecs.start_task

        def spy(**kwargs: object):  # type: ignore[no-untyped-def]
            seen.append(kwargs.get("overrides"))
            return original(**kwargs)  # type: ignore[arg-type]

        w.ecs.start_task = spy  # type: ignore[method-assign]
        start(w, node_tasks.HEALTH_CHECK, Claim(), environment={"A": "1"})
        start(w, node_tasks.VALIDATION, Claim(), environment={"B": "2", "A": "1"})
    assert seen[0] is None
    assert seen[1] == {"containerOverrides": [{"name": node_tasks.VALIDATION.container, "environment": [
        {"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}]}


def test_a_refused_start_gives_the_claim_back_and_raises() -> None:
    with world() as w:
        w.ecs.failures["start_task"] = ["refuse"]
        claim = Claim()
        with pytest.raises(Exception, match="Rate exceeded"):
            start(w, node_tasks.HEALTH_CHECK, claim)
        assert claim.released == 1 and claim.recorded == [] and w.ecs.tasks == {}


def test_a_lost_answer_keeps_the_claim_for_the_lookup_of_its_task() -> None:
    with world() as w:
        w.ecs.failures["start_task"] = ["lose"]
        claim = Claim()
        with pytest.raises(LostResponse):
            start(w, node_tasks.HEALTH_CHECK, claim)
        [task] = w.ecs.tasks.values()  # it did start: only its answer was lost
        assert claim.released == 0 and claim.recorded == []
        assert started_already(w.ecs, "claim-1", ["node-a"]) == {"node-a": task.arn}


def test_a_task_not_placed_is_neither_recorded_nor_released_here() -> None:
    with world() as w:
        w.ecs.failures["start_task"] = ["place_nothing"]
        claim = Claim()
        placed = start(w, node_tasks.GPU_RESET, claim)
        assert placed.task_arn is None and placed.reasons == "RESOURCE:GPU"  # the stage decides
        assert claim.released == 0 and claim.recorded == []


def test_no_turn_at_the_budget_never_calls_start_task_and_leaves_the_claim_to_the_stage() -> None:
    with world() as w:
        w.ecs.failures["prepay_in_turn"] = ["rate_limited"]
        claim = Claim()
        with pytest.raises(RateLimited):
            start(w, node_tasks.HEALTH_CHECK, claim, turn_within=5.0)
        assert w.ecs.start_calls == [] and claim.released == 0
        start(w, node_tasks.HEALTH_CHECK, claim, turn_within=5.0)
        assert w.ecs.prepaid == 1 and len(claim.recorded) == 1


class Stage:
    """A stage as ``claim_and_start`` sees it (a GPU reset's), and what it was asked to do."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    @staticmethod
    def deadline(instance: Instance) -> float:
        return (instance.reboot_requested_at or 0.0) + 3600

    @staticmethod
    def new_started_by(instance: Instance) -> str:
        return "claim-new"

    def start_task(self, instance: Instance, started_by: str) -> str:
        self.asked.append(f"start_task {started_by}")
        return "started"


def resetting(w: World, **claim: object) -> Instance:
    """node-a decided for a GPU reset (REBOOTING, ``reset_pending``), its claim as ``claim``."""
    item = {C.INSTANCE_PK: "node-a", "instance_state": InstanceState.REBOOTING.value,
            "reboot_requested_at": w.now[0] - 60, "reset_pending": True, **claim}
    boto3.resource("dynamodb", region_name="us-east-1").Table("instances").put_item(Item=to_ddb(item))
    instance = w.repo.instances.get_instance("node-a")
    assert instance is not None
    return instance


def claim_and_start(w: World, stage: Stage, instance: Instance) -> str:
    return w.service.node_tasks.claim_and_start(node_tasks.GPU_RESET, stage, instance)


def the_claim(fields: ClaimFields, instance: Instance | None) -> tuple[str, float, str]:
    """The claim's startedBy, claim time (0.0: none) and task, as ``instance`` holds it."""
    assert instance is not None
    claim = fields.read(instance)
    return claim.started_by, claim.claimed_at or 0.0, claim.task_arn


def stored_claim(w: World) -> tuple[str, float, str]:
    return the_claim(stored.GPU_RESET, w.repo.instances.get_instance("node-a"))


def test_a_recorded_task_runs_and_a_live_claim_is_its_claimer_s() -> None:
    with world() as w:
        running, live = Stage(), Stage()
        recorded = resetting(w, reset_started_by="claim-1", reset_claimed_at=w.now[0],
                             reset_task_arn="arn:task")
        assert claim_and_start(w, running, recorded) == "gpu_reset_running" and running.asked == []
        in_lease = resetting(w, reset_started_by="claim-1", reset_claimed_at=w.now[0] - 1)
        assert claim_and_start(w, live, in_lease) == "gpu_reset_claimed" and live.asked == []


def test_a_dead_claim_is_taken_over_and_its_task_looked_up_before_one_is_started() -> None:
    with world() as w:
        dead = resetting(w, reset_started_by="claim-1", reset_claimed_at=w.now[0] - 3600)
        nothing_started = Stage()
        assert claim_and_start(w, nothing_started, dead) == "started"
        assert nothing_started.asked == ["start_task claim-1"]
        assert stored_claim(w) == ("claim-1", w.now[0], "")  # the lease runs from the take-over
        lost_race = Stage()  # a second taker read the claim before the first took it over
        assert claim_and_start(w, lost_race, dead) == "raced" and lost_race.asked == []
    with world() as w:
        dead = resetting(w, reset_started_by="claim-1", reset_claimed_at=w.now[0] - 3600)
        task = w.ecs.start_task(task_definition="gpu-reset", container_instance_arn="node-a",
                                started_by="claim-1").task_arns[0]
        started_before = Stage()  # its answer was lost: the task exists, and is recorded
        assert claim_and_start(w, started_before, dead) == "gpu_reset_found" and started_before.asked == []
        assert stored_claim(w) == ("claim-1", w.now[0], task)


def test_a_new_claim_waits_for_the_node_s_gpus_then_starts() -> None:
    with world() as w:
        w.register_job("j", ["node-a", "node-b"])  # a live rank holds node-a's GPUs
        busy = Stage()
        assert claim_and_start(w, busy, resetting(w)) == "gpu_reset_waiting_for_gpus" and busy.asked == []
        assert w.repo.instances.get_instance("node-a").deadline_at == w.now[0] + RETRY_INTERVAL_SECONDS
    with world() as w:
        free, lost_race = Stage(), Stage()
        unclaimed = resetting(w)
        assert claim_and_start(w, free, unclaimed) == "started" and free.asked == ["start_task claim-new"]
        assert stored_claim(w) == ("claim-new", w.now[0], "")
        assert claim_and_start(w, lost_race, unclaimed) == "raced" and lost_race.asked == []


def test_a_refused_start_under_a_claim_gives_it_back_and_a_placed_one_is_recorded() -> None:
    with world() as w:
        w.ecs.failures["start_task"] = ["refuse"]
        claimed = resetting(w, reset_started_by="claim-1", reset_claimed_at=w.now[0])
        with pytest.raises(Exception, match="Rate exceeded"):
            w.service.node_tasks.start_claimed(node_tasks.GPU_RESET, Stage(), claimed, "claim-1")
        assert stored_claim(w) == ("", 0.0, "")
        claimed = resetting(w, reset_started_by="claim-1", reset_claimed_at=w.now[0])
        placed = w.service.node_tasks.start_claimed(node_tasks.GPU_RESET, Stage(), claimed, "claim-1")
        assert placed.task_arn and stored_claim(w) == ("claim-1", w.now[0], placed.task_arn)
        instance = w.repo.instances.get_instance("node-a")
        assert instance.deadline_at == w.now[0] + node_tasks.POLL_SECONDS  # the sweep looks at it then


def test_each_kind_declares_where_its_claim_is_stored() -> None:
    """A GPU reset keeps its claim in top-level attributes, a validation in its map (the
    other keys of the map kept), a health check in its ``hc_*`` attributes, its lease apart;
    the instance holds each the one way (``Instance.tasks``, by kind)."""
    assert node_tasks.HEALTH_CHECK.claim is stored.HEALTH_CHECK
    assert stored.HEALTH_CHECK.lease_until == "hc_lease_until"
    assert stored.HEALTH_CHECK.state is InstanceState.HEALTH_CHECKING
    item = {C.INSTANCE_PK: "node-a", "hc_started_by": "claim-h", "hc_claimed_at": 7.0, "hc_lease_until": 82.0,
            "hc_start_attempts": 1, "reset_started_by": "claim-r", "reset_claimed_at": 6.0,
            "reset_task_arn": "arn:r", "validation": {"since": 1.0, "attempts": 2, "started_by": "claim-v",
                                                       "claimed_at": 5.0}}
    instance = instance_from_item(item)
    assert instance.tasks == {
        HEALTH_CHECK_TASK: TaskClaim("claim-h", 7.0, "", lease_until=82.0, attempts=1),
        GPU_RESET_TASK: TaskClaim("claim-r", 6.0, "arn:r"),
        VALIDATION_TASK: TaskClaim("claim-v", 5.0, "", attempts=2)}
    assert instance.check is instance.tasks[HEALTH_CHECK_TASK] and instance.validation["since"] == 1.0
    assert instance_from_item({C.INSTANCE_PK: "node-b"}).tasks == {}
    check = stored.HEALTH_CHECK.claimed(Instance("node-a"), "claim-h", 7.0)
    assert the_claim(stored.HEALTH_CHECK, check) == ("claim-h", 7.0, "")
    claimed = stored.VALIDATION.claimed(Instance("node-a", validation={"since": 1.0}), "claim-v", 5.0)
    assert the_claim(stored.VALIDATION, claimed) == ("claim-v", 5.0, "")
    reset = stored.GPU_RESET.claimed(Instance("node-a"), "claim-r", 6.0)
    assert reset.task(GPU_RESET_TASK) == TaskClaim("claim-r", 6.0, "")
    assert reset.task(VALIDATION_TASK) == NO_CLAIM


def test_the_sweep_s_look_asks_again_once_before_it_calls_a_task_gone() -> None:
    with world() as w:
        tasks = w.service.node_tasks
        arn = start(w, node_tasks.VALIDATION, Claim()).task_arn
        assert arn is not None and tasks.look(arn)["taskArn"] == arn  # type: ignore[index]
        asked: list[str] = []
        described = w.ecs.describe_task
        answers = iter([None, described(arn)])  # MISSING once: a describe not caught up

        def flaky(task_arn: str) -> dict[str, object] | None:
            asked.append(task_arn)
            return next(answers)

        w.ecs.describe_task = flaky  # type: ignore[method-assign,assignment]
        assert tasks.look(arn)["taskArn"] == arn and asked == [arn, arn]  # type: ignore[index]
        w.ecs.describe_task = described  # type: ignore[method-assign]
        w.ecs.missing_tasks.add(arn)  # MISSING twice in a row: gone
        assert tasks.look(arn) is None


def test_a_claim_s_lease_ends_where_its_kind_keeps_it_and_a_take_over_renews_it_there() -> None:
    """A reset's lease runs from its claim time, which a take-over moves; a check's is kept
    apart (``hc_lease_until``), which a take-over renews, its claim time kept."""
    reset = stored.GPU_RESET.claimed(Instance("node-a"), "claim-r", 100.0)
    assert not stored.GPU_RESET.lease_ended(reset, 174.0, 75)
    assert stored.GPU_RESET.lease_ended(reset, 175.0, 75)
    assert stored.GPU_RESET.read(stored.GPU_RESET.taken_over(reset, 200.0, 275.0)).claimed_at == 200.0
    check = stored.HEALTH_CHECK.with_claim(Instance("node-a"), started_by="claim-h", claimed_at=100.0,
                                          lease_until=500.0)
    assert not stored.HEALTH_CHECK.lease_ended(check, 499.0, 75)  # its claim time is not its lease
    assert stored.HEALTH_CHECK.lease_ended(check, 500.0, 75)
    taken = stored.HEALTH_CHECK.taken_over(check, 600.0, 675.0)
    assert (taken.check.claimed_at, taken.check.lease_until) == (100.0, 675.0)


def checking(w: World, **claim: object) -> Instance:
    """node-a in its health check, claimed by ``claim-1`` an hour ago, its lease ended."""
    item = {C.INSTANCE_PK: "node-a", "instance_state": InstanceState.HEALTH_CHECKING.value,
            "hc_started_by": "claim-1", "hc_claimed_at": w.now[0] - 100, "hc_lease_until": w.now[0] - 25,
            **claim}
    boto3.resource("dynamodb", region_name="us-east-1").Table("instances").put_item(Item=to_ddb(item))
    instance = w.repo.instances.get_instance("node-a")
    assert instance is not None
    return instance


def test_a_health_check_s_dead_claim_is_taken_over_the_way_every_kind_s_is() -> None:
    """The check's take-over is the component's: within its lease it is its claimer's; once
    the lease ended, one taker; a task its claimer started is found by its startedBy and
    recorded (looked at within the check's own poll interval); else the taker starts it."""
    tasks_of = node_tasks.HEALTH_CHECK
    with world() as w:
        tasks = w.service.node_tasks
        live = checking(w, hc_lease_until=w.now[0] + 10)
        assert tasks.take_over(tasks_of, live, w.now[0], deadline=w.now[0] + 3600).step == "claimed"
        dead = checking(w)
        taken = tasks.take_over(tasks_of, dead, w.now[0], deadline=w.now[0] + 3600)
        assert taken.step == "taken" and taken.instance is not None
        lease_until = w.now[0] + C.CLAIM_LEASE_SECONDS
        assert (taken.instance.check.claimed_at, taken.instance.check.lease_until) == (w.now[0] - 100,
                                                                                       lease_until)
        assert w.repo.instances.get_instance("node-a").check.lease_until == taken.instance.check.lease_until
        assert tasks.take_over(tasks_of, dead, w.now[0], deadline=w.now[0] + 3600).step == "raced"
    with world() as w:
        tasks = w.service.node_tasks
        task = w.ecs.start_task(task_definition="dcgm", container_instance_arn="node-a",
                                started_by="claim-1").task_arns[0]
        found = tasks.take_over(tasks_of, checking(w), w.now[0], deadline=w.now[0] + 3600)
        assert (found.step, found.task_arn, found.instance) == ("found", task, None)
        recorded = w.repo.instances.get_instance("node-a")
        assert the_claim(stored.HEALTH_CHECK, recorded) == ("claim-1", w.now[0] - 100, task)
        assert recorded.deadline_at == w.now[0] + node_tasks.HEALTH_CHECK_POLL_SECONDS
        assert w.ecs.start_calls == [1] and len(w.ecs.tasks) == 1  # the claimer's; none started since


def test_a_recorded_task_is_looked_at_within_its_kind_s_poll_interval_and_by_its_deadline() -> None:
    with world() as w:
        tasks = w.service.node_tasks
        instance = checking(w)
        tasks.record(node_tasks.HEALTH_CHECK, instance, "claim-1", "arn:hc", deadline=w.now[0] + 3600)
        deadline = w.repo.instances.get_instance("node-a").deadline_at
        assert deadline == w.now[0] + node_tasks.HEALTH_CHECK_POLL_SECONDS
        reset = resetting(w, reset_started_by="claim-r", reset_claimed_at=w.now[0])
        tasks.record(node_tasks.GPU_RESET, reset, "claim-r", "arn:r", deadline=w.now[0] + 3600)
        assert w.repo.instances.get_instance("node-a").deadline_at == w.now[0] + node_tasks.POLL_SECONDS
        reset = resetting(w, reset_started_by="claim-r", reset_claimed_at=w.now[0])
        tasks.record(node_tasks.GPU_RESET, reset, "claim-r", "arn:r", deadline=w.now[0] + 30)
        assert w.repo.instances.get_instance("node-a").deadline_at == w.now[0] + 30  # out of time first


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_kind_waits_while_a_live_rank_holds_the_node_s_gpus(kind: NodeTaskKind) -> None:
    with world() as w:
        assert not w.service.node_tasks.gpus_busy(kind, Instance("node-a"))
        w.register_job("j", ["node-a", "node-b"])
        assert w.service.node_tasks.gpus_busy(kind, Instance("node-a"))
        assert not w.service.node_tasks.gpus_busy(kind, Instance("node-c"))


class Followed(Stage):
    """A stage as the sweep's look (``NodeTasks.follow``) sees it: its start is the claim's."""

    def __init__(self, w: World) -> None:
        super().__init__()
        self.w = w

    def start(self, instance: Instance) -> str:
        return claim_and_start(self.w, self, instance)

    def gone(self, instance: Instance) -> str:
        return "gone"

    def on_stopped(self, detail: object) -> node_tasks.Outcome:
        raise AssertionError("no task was recorded")


def test_the_sweep_looks_at_a_claim_in_flight_again_once_its_lease_ends() -> None:
    """The claimer's lease as read (a reset's from its claim time), or the one another taker
    has just begun: the next look is when no claimer may still be starting the task."""
    with world() as w:
        live = resetting(w, reset_started_by="claim-1", reset_claimed_at=w.now[0] - 30)
        stage = Followed(w)
        assert w.service.node_tasks.follow(node_tasks.GPU_RESET, stage, live, w.now[0]) == "gpu_reset_claimed"
        assert w.repo.instances.get_instance("node-a").deadline_at == w.now[0] - 30 + C.CLAIM_LEASE_SECONDS
        assert stage.asked == []
    with world() as w:
        dead = resetting(w, reset_started_by="claim-1", reset_claimed_at=w.now[0] - 3600)
        assert claim_and_start(w, Stage(), dead) == "started"  # another taker, just now
        late = Followed(w)  # read the claim before it was taken over
        assert w.service.node_tasks.follow(node_tasks.GPU_RESET, late, dead, w.now[0]) == "raced"
        assert w.repo.instances.get_instance("node-a").deadline_at == w.now[0] + C.CLAIM_LEASE_SECONDS
        assert late.asked == []
