"""Registration of a rank from its ECS event (the convention: ``group`` names the job, the
container environment its rank), and the tag path's one lookup per task (issue 28).

Events are the AWS-shaped fixture ``tests/events/convention_task_running.json`` (the AWS
documentation's task state change, on EC2 with the convention's group and environment).
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from gpu_recovery import constants as C
from gpu_recovery import event_patterns as patterns
from gpu_recovery.domain.states import JobState, RankState
from gpu_recovery.events.ecs import EcsTaskStateChangeEvent
from gpu_recovery.recovery.ranks import overrides_for_attempt, registration_from_event
from tests.recovery.fakes import CLUSTER_ARN, EVENTS, FakeTask, ci_arn, world

FIXTURE = json.loads((EVENTS / "convention_task_running.json").read_text())


class CountingDescribe:
    """Wraps FakeEcs.describe_task: every DescribeTasks the handler makes is counted."""

    def __init__(self, ecs: Any) -> None:
        self.calls: list[str] = []
        real = ecs.describe_task

        def describe(task_arn: str) -> dict[str, Any] | None:
            self.calls.append(task_arn)
            return real(task_arn)

        ecs.describe_task = describe


def event(*, task: str = "", rank: int = 3, world_size: int = 8, attempt: int | None = 1,
          group: str = "gpu-recovery:llm-pretrain-42", status: str = "RUNNING", node: str = "node-3",
          env: list[dict[str, str]] | None = None) -> Any:
    raw = copy.deepcopy(FIXTURE)
    detail = raw["detail"]
    detail.update(clusterArn=CLUSTER_ARN, group=group, lastStatus=status,
                  containerInstanceArn=ci_arn(node))
    if task:
        detail["taskArn"] = task
    if env is None:
        env = [{"name": "MASTER_ADDR", "value": "10.0.0.17"}, {"name": "RANK", "value": str(rank)},
               {"name": "WORLD_SIZE", "value": str(world_size)}]
        if attempt is not None:
            env.append({"name": "ATTEMPT", "value": str(attempt)})
    detail["overrides"] = {"containerOverrides": [{"name": "trainer", "environment": env}]}
    if status == "STOPPED":
        detail.update(desiredStatus="STOPPED", stopCode="EssentialContainerExited",
                      stoppedReason="Essential container in task exited")
        detail["containers"][0]["exitCode"] = 0
    return EcsTaskStateChangeEvent.model_validate(raw).detail


def test_fixture_is_the_convention() -> None:
    reg = registration_from_event(FIXTURE["detail"])
    assert reg is not None
    assert (reg.job_id, reg.rank, reg.world_size, reg.attempt) == ("llm-pretrain-42", 3, 8, 1)
    assert reg.gpus == 2 and reg.group == "gpu-recovery:llm-pretrain-42"
    assert reg.container_instance_arn.endswith("/node-3")


def test_running_event_registers_the_rank_without_describe_tasks() -> None:
    with world() as w:
        describes = CountingDescribe(w.ecs)
        detail = event()
        out = w.service.on_task_state_change(detail)
        again = w.service.on_task_state_change(detail)  # at-least-once delivery
        assert out.action == again.action == "running"
        assert describes.calls == []
        rank = w.repo.jobs.get_rank("llm-pretrain-42", 3)
        assert rank.state is RankState.RUNNING and rank.task_arn == detail.taskArn
        assert rank.group == "gpu-recovery:llm-pretrain-42" and rank.gpus == 2
        job = w.repo.jobs.get_job("llm-pretrain-42")
        assert job.world_size == 8 and job.state is JobState.RUNNING
        assert w.repo.latches.registered("llm-pretrain-42", 1, 8) == {3}


def test_stopped_event_of_an_unseen_convention_task_is_judged() -> None:
    """The RUNNING event was lost: the STOPPED one registers the rank and is processed."""
    with world() as w:
        describes = CountingDescribe(w.ecs)
        out = w.service.on_task_state_change(event(status="STOPPED"))
        assert out.job_id == "llm-pretrain-42"
        assert describes.calls == []
        assert w.repo.jobs.get_rank("llm-pretrain-42", 3).state is RankState.DONE


def test_an_older_attempt_s_task_is_not_registered_over_the_new_one() -> None:
    with world() as w:
        new = event(task=f"{FIXTURE['detail']['taskArn']}-a2", attempt=2)
        w.service.on_task_state_change(new)
        old = w.service.on_task_state_change(event(attempt=1))
        assert old.detail == {"why": "task of an older attempt"}
        assert w.repo.jobs.get_rank("llm-pretrain-42", 3).task_arn == new.taskArn


class CountingIndexLookups:
    """Wraps the repository's task-index lookup (a Query of ``by-task-arn``): each is counted."""

    def __init__(self, repo: Any) -> None:
        self.calls: list[str] = []
        real = repo.registrations.look_up_task

        def look_up_task(task_arn: str) -> Any:
            self.calls.append(task_arn)
            return real(task_arn)

        repo.registrations.look_up_task = look_up_task


def test_a_registered_rank_s_events_read_it_by_its_key_not_through_the_task_index() -> None:
    """The rank the event names records this task: one GetItem by key, no index Query."""
    with world() as w:
        first = w.service.on_task_state_change(event())  # registers rank 3
        lookups = CountingIndexLookups(w.repo)
        stopped = w.service.on_task_state_change(event(status="STOPPED"))
        assert first.action == "running" and stopped.job_id == "llm-pretrain-42"
        assert lookups.calls == []
        assert w.repo.jobs.get_rank("llm-pretrain-42", 3).state is RankState.DONE


@pytest.mark.parametrize("named_rank", [3, 5])
def test_an_event_naming_a_rank_that_records_another_task_is_not_taken_for_it(named_rank: int) -> None:
    """What the event names is only where to look: a task whose environment names rank 3 (its
    own, an older attempt's, or another's) while rank 3 records another task is looked up by
    its own task, and rank 3 keeps its task."""
    with world() as w:
        registered = event()
        w.service.on_task_state_change(registered)
        lookups = CountingIndexLookups(w.repo)
        other = event(task=f"{FIXTURE['detail']['taskArn']}-other", rank=named_rank, attempt=1)
        if named_rank == 3:
            assert w.service.on_task_state_change(other).detail == {"why": "task of an older attempt"}
        else:
            w.service.on_task_state_change(other)
        assert lookups.calls == [other.taskArn]
        assert w.repo.jobs.get_rank("llm-pretrain-42", 3).task_arn == registered.taskArn


def test_a_rank_registered_by_its_event_keeps_the_tags_it_was_launched_with() -> None:
    """Issue 49's campaign defect: a restart's registration lost (its response), the new
    attempt's RUNNING event registers the rank by the convention, which carries no tags; the
    launcher's tags (job id, rank, world size) stay on the rank, the attempt's updated, so the
    next restart starts it with them (it was started with the attempt tag alone)."""
    with world() as w:
        launched = [{"key": C.TAG_JOB_ID, "value": "llm-pretrain-42"}, {"key": C.TAG_RANK, "value": "3"},
                    {"key": C.TAG_WORLD_SIZE, "value": "8"}, {"key": C.TAG_ATTEMPT, "value": "1"}]
        launch = registration_from_event(event().model_dump())
        assert launch is not None
        w.service.register_rank(replace(launch, tags=launched))  # as the queue's launcher does
        w.service.on_task_state_change(event(task=f"{FIXTURE['detail']['taskArn']}-a2", attempt=2))
        rank = w.repo.jobs.get_rank("llm-pretrain-42", 3)
        assert rank.attempt == 2
        assert {t["key"]: t["value"] for t in rank.tags} == {
            C.TAG_JOB_ID: "llm-pretrain-42", C.TAG_RANK: "3", C.TAG_WORLD_SIZE: "8", C.TAG_ATTEMPT: "2"}


@pytest.mark.parametrize("env", [
    [{"name": "RANK", "value": "8"}, {"name": "WORLD_SIZE", "value": "8"}],  # rank out of range
    [{"name": "RANK", "value": "three"}, {"name": "WORLD_SIZE", "value": "8"}],
    [{"name": "RANK", "value": "1"}],  # no world size
])
def test_a_malformed_convention_is_not_registered_nor_described(env: list[dict[str, str]]) -> None:
    with world() as w:
        describes = CountingDescribe(w.ecs)
        out = w.service.on_task_state_change(event(env=env))
        assert out.action == "ignored"
        assert describes.calls == [] and w.repo.jobs.get_job("llm-pretrain-42") is None


def test_a_convention_job_too_large_is_refused() -> None:
    with world() as w:
        out = w.service.on_task_state_change(event(rank=0, world_size=C.MAX_WORLD_SIZE + 8))
        assert out.action == "ignored"
        assert w.repo.jobs.get_job("llm-pretrain-42") is None
        assert len(w.notifier.sent) == 1


def _untagged_task(w: Any, arn: str) -> None:
    w.ecs.tasks[arn] = FakeTask(arn, "node-9", "ecs-svc/1234", "service:web")


def test_an_unprotected_task_is_described_once_over_its_life() -> None:
    """RUNNING and STOPPED, each delivered twice: one DescribeTasks, then its negative record."""
    with world() as w:
        describes = CountingDescribe(w.ecs)
        arn = "arn:aws:ecs:us-east-1:111122223333:task/gpu-cluster/0123456789abcdef0123456789abcdef"
        _untagged_task(w, arn)
        for status in ("RUNNING", "RUNNING", "STOPPED", "STOPPED"):
            out = w.service.on_task_state_change(event(task=arn, group="service:web", status=status,
                                                       env=[]))
            assert out.detail == {"why": "not a protected job"}
        assert describes.calls == [arn]


def test_convention_mode_never_describes() -> None:
    with world(registration="convention") as w:
        describes = CountingDescribe(w.ecs)
        arn = "arn:aws:ecs:us-east-1:111122223333:task/gpu-cluster/fedcba9876543210fedcba9876543210"
        _untagged_task(w, arn)
        other = event(task=arn, group="service:web", env=[])
        assert w.service.on_task_state_change(other).action == "ignored"
        assert describes.calls == []
        assert w.service.on_task_state_change(event()).action == "running"


def test_tags_mode_ignores_the_convention() -> None:
    with world(registration="tags") as w:
        describes = CountingDescribe(w.ecs)
        detail = event()
        w.ecs.tasks[detail.taskArn] = FakeTask(detail.taskArn, "node-3", "torch-launcher", detail.group)
        assert w.service.on_task_state_change(detail).action == "ignored"  # no tags on the task
        assert describes.calls == [detail.taskArn]


def test_overrides_for_attempt_rewrites_only_the_attempt() -> None:
    overrides = {"containerOverrides": [{"name": "trainer", "command": ["train"], "environment": [
        {"name": "RANK", "value": "3"}, {"name": "ATTEMPT", "value": "1"}]}], "cpu": "0"}
    out = overrides_for_attempt(overrides, 4)
    assert out["containerOverrides"][0]["environment"] == [{"name": "RANK", "value": "3"},
                                                           {"name": "ATTEMPT", "value": "4"}]
    assert out["containerOverrides"][0]["command"] == ["train"] and out["cpu"] == "0"
    assert overrides["containerOverrides"][0]["environment"][1]["value"] == "1"  # not mutated
    plain = {"containerOverrides": [{"name": "trainer", "environment": [{"name": "X", "value": "1"}]}]}
    assert overrides_for_attempt(plain, 4) is plain


def test_convention_pattern_leaves_other_workloads_out() -> None:
    pattern = patterns.training_task_pattern(CLUSTER_ARN, "convention")
    assert pattern["detail"]["group"] == [{"prefix": C.JOB_GROUP_PREFIX}]
    assert not C.HEALTH_CHECK_GROUP.startswith(C.JOB_GROUP_PREFIX)
    both = patterns.training_task_pattern(CLUSTER_ARN)
    assert both["detail"]["group"] == [{"anything-but": {"prefix": C.HEALTH_CHECK_GROUP}}]


# ------------------------------------------------------------------ tag lookups (batched)
def _tagged(w: Any, arn: str, node: str, rank: int, world_size: int) -> None:
    w.ecs.tasks[arn] = FakeTask(arn, node, "other-launcher", "family:train")
    w.tags[arn] = [{"key": C.TAG_JOB_ID, "value": "tagged-job"}, {"key": C.TAG_RANK, "value": str(rank)},
                   {"key": C.TAG_WORLD_SIZE, "value": str(world_size)}]


class TaggedDescribe:
    """FakeEcs's DescribeTasks with the tags of ``w.tags``; every call's ARNs recorded."""

    def __init__(self, w: Any) -> None:
        self.calls: list[list[str]] = []
        w.tags = {}
        real = w.ecs.describe_task

        def one(arn: str) -> dict[str, Any] | None:
            task = real(arn)
            return None if task is None else {**task, "tags": w.tags.get(arn, [])}

        def many(arns: list[str]) -> list[dict[str, Any]]:
            self.calls.append(list(arns))
            return [t for t in (one(a) for a in arns) if t is not None]

        def single(arn: str) -> dict[str, Any] | None:
            self.calls.append([arn])
            return one(arn)

        w.ecs.describe_tasks, w.ecs.describe_task = many, single


def test_unknown_tasks_go_to_the_tag_lookup_worker_and_are_described_together() -> None:
    from tests.recovery.fakes import FakeQueue

    with world(tag_lookups=FakeQueue) as w:
        describes = TaggedDescribe(w)
        queue = w.service.ranks.tag_lookups
        base = "arn:aws:ecs:us-east-1:111122223333:task/gpu-cluster/"
        arns = [f"{base}{i:032x}" for i in range(3)]
        _tagged(w, arns[0], "node-0", 0, 2)
        _tagged(w, arns[1], "node-1", 1, 2)
        w.ecs.tasks[arns[2]] = FakeTask(arns[2], "node-9", "ecs-svc/1", "service:web")  # no tags
        details = [event(task=a, group=w.ecs.tasks[a].group, env=[], node=w.ecs.tasks[a].node)
                   for a in (arns[0], arns[0], arns[1], arns[2])]  # rank 0's event delivered twice
        outcomes = [w.service.on_task_state_change(d) for d in details]
        assert {o.action for o in outcomes} == {"lookup_queued"} and describes.calls == []
        assert len(queue.messages) == 4
        sent = [EcsTaskStateChangeEvent.model_validate({**FIXTURE, "detail": body["detail"]}).detail
                for body, _ in queue.messages]
        handled = w.service.on_tag_lookups(sent)
        assert describes.calls == [arns]  # one DescribeTasks for the batch's three tasks
        assert [getattr(o, "action", o) for o in handled] == ["running", "running", "running", "ignored"]
        assert w.repo.jobs.get_job("tagged-job").world_size == 2
        assert {w.repo.jobs.get_rank("tagged-job", r).task_arn for r in (0, 1)} == set(arns[:2])
        # The untagged task's later events cost nothing: its negative record answers.
        queue.messages.clear()
        stopped = event(task=arns[2], group="service:web", env=[], node="node-9", status="STOPPED")
        assert w.service.on_task_state_change(stopped).detail == {"why": "not a protected job"}
        assert queue.messages == [] and describes.calls == [arns]
        # Known ranks' events no longer go to the worker either.
        assert w.service.on_task_state_change(details[0]).action == "running"
        assert queue.messages == []


@pytest.mark.parametrize("step", ["look_up_task", "put_rank_registration"])
def test_a_task_whose_own_lookup_fails_is_delivered_again_alone_while_the_batch_goes_on(
        step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of two tagged tasks, one task's own read throttled (or its registration's write,
    twice: it is tried again at once): that task's event alone is answered with the error (its
    message delivered again), the other's is handled; delivered again, it is handled too. A
    batch failed by any one task's call came back whole, each time with the same odds: soak
    seed 7240 at 6 % of calls failing dead-lettered 33 tag lookups after their tenth receive."""
    from tests.recovery.fakes import throttled

    with world() as w:
        describes = TaggedDescribe(w)
        base = "arn:aws:ecs:us-east-1:111122223333:task/gpu-cluster/"
        arns = [f"{base}{i:032x}" for i in range(2)]
        _tagged(w, arns[0], "node-0", 0, 2)
        _tagged(w, arns[1], "node-1", 1, 2)
        records = w.service.ranks.records
        real, failed = getattr(records, step), []
        times = 1 if step == "look_up_task" else 2

        def broken(arg: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(arg, "task_arn", arg) == arns[1] and len(failed) < times:
                failed.append(step)
                raise throttled("Query" if step == "look_up_task" else "PutItem")
            return real(arg, *args, **kwargs)

        monkeypatch.setattr(records, step, broken)
        details = [event(task=a, group="family:train", env=[], node=w.ecs.tasks[a].node) for a in arns]
        handled = w.service.on_tag_lookups(details)
        assert failed == [step] * times, "premise: the second task's own call was throttled"
        assert getattr(handled[0], "action", None) == "running"
        assert isinstance(handled[1], Exception) and "ThrottlingException" in str(handled[1])
        assert [getattr(o, "action", o) for o in w.service.on_tag_lookups(details[1:])] == ["running"]
        assert {w.repo.jobs.get_rank("tagged-job", r).task_arn for r in (0, 1)} == set(arns)
        assert describes.calls[0] == (arns if step == "put_rank_registration" else arns[:1])


def test_a_failed_describe_fails_the_whole_lookup_batch() -> None:
    with world() as w:
        def refused(arns: list[str]) -> list[dict[str, Any]]:
            raise RuntimeError("ThrottlingException")

        w.ecs.describe_tasks = refused
        arn = "arn:aws:ecs:us-east-1:111122223333:task/gpu-cluster/" + "ab" * 16
        with pytest.raises(RuntimeError):
            w.service.on_tag_lookups([event(task=arn, group="family:train", env=[])])
        # nothing remembered: looked up again
        assert w.repo.registrations.look_up_task(arn).unprotected is False
