"""Rank operations shared by the stages: registration, discovery, notifying.

Registering a rank also makes it arrive at its attempt's *registered* latch
(``domain.latch``), so "every rank of the attempt is registered" is known without reading
every rank. Stopping a gang is a fan-out of its own (``recovery.gang``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from functools import partial
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.adapters.ecs import EcsActionFailed
from gpu_recovery.constants import (
    ENV_VAR_ATTEMPT,
    ENV_VAR_MAX_APP_RESTARTS,
    ENV_VAR_MAX_INFRA_RECOVERIES,
    ENV_VAR_RANK,
    ENV_VAR_RELOCATABLE,
    ENV_VAR_SECURITY_GROUPS,
    ENV_VAR_SUBNETS,
    ENV_VAR_WORLD_SIZE,
    MAX_TASK_TAGS,
    MAX_WORLD_SIZE,
    TAG_ATTEMPT,
    TAG_JOB_ID,
    TAG_MAX_APP_RESTARTS,
    TAG_MAX_INFRA_RECOVERIES,
    TAG_RANK,
    TAG_RANKS,
    TAG_RELOCATABLE,
    TAG_SECURITY_GROUPS,
    TAG_SUBNETS,
    TAG_WORLD_SIZE,
    NotificationKind,
)
from gpu_recovery.domain import started_by as task_started_by
from gpu_recovery.domain.gang_batches import GangQueuePort
from gpu_recovery.domain.job_budgets import MAX_BUDGET
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.launch_plan import StartCall, parse_ranks_tag
from gpu_recovery.domain.models import Instance, Job, Rank, container_instance_id, task_time
from gpu_recovery.domain.notifications import NotificationFacts
from gpu_recovery.domain.states import RECOVERING_JOB_STATES, JobState, RankState
from gpu_recovery.domain.task_network import NetworkError, awsvpc_configuration, eni_subnet, id_list
from gpu_recovery.events.ecs import EcsTaskDetail
from gpu_recovery.once_more import twice
from gpu_recovery.recovery.notices import Notices
from gpu_recovery.recovery.ports import EcsPort, MetricsPort
from gpu_recovery.recovery.reactions import Reactions, reserved_first
from gpu_recovery.recovery.task_convention import container_environment, convention_job_id, convention_rank
from gpu_recovery.recovery.task_refusals import (
    NetworkUnknown,
    NotProtected,
    Refused,
    StartedForSeveralRanks,
    TooLarge,
    TooManyTags,
)
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.latches import Arrival, LatchRepository
from gpu_recovery.repository.registrations import RegistrationRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class RankRegistration:
    """Everything a restart needs, captured while ECS still describes the task."""

    job_id: str
    rank: int
    world_size: int
    attempt: int
    task_arn: str
    task_definition_arn: str
    container_instance_arn: str
    ec2_instance_id: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    tags: list[dict[str, str]] = field(default_factory=list)
    group: str = ""
    started_by: str = ""
    state: RankState = RankState.RUNNING
    max_recovery_attempts: int | None = None  # infrastructure recoveries (None: the deployment's)
    max_app_restarts: int | None = None  # application-error restarts (None: the deployment's)
    gpus: int = 0  # GPUs the task holds (0: unknown)
    subnet: str = ""  # the task's elastic network interface's (awsvpc tasks)
    network: dict[str, Any] = field(default_factory=dict)  # the job's awsvpcConfiguration ({}: none)
    created_at: float | None = None  # when ECS created the task (its StartTask), if said


class LookupQueued(Exception):
    """The task's event went to the tag lookup worker (which registers it and handles it)."""


def _task_network(task: dict[str, Any], values: dict[Any, Any], groups_key: str, subnets_key: str,
                  job_id: str, world_size: int) -> tuple[str, dict[str, Any]]:
    """(the task's own subnet, the job's awsvpcConfiguration) from its attachment and the
    tags (or convention environment) ``values``; NetworkUnknown for an awsvpc task without
    its security groups or with ids ECS would refuse."""
    subnet = eni_subnet(task)
    if not subnet:
        return "", {}
    groups = id_list(str(values.get(groups_key) or ""))
    if not groups:
        raise NetworkUnknown(job_id, world_size,
                             f"task {task.get('taskArn')} of job {job_id} is in the awsvpc network mode and "
                             f"names no security groups ({groups_key}): ECS tells a task's subnet, not its "
                             "security groups")
    try:
        return subnet, awsvpc_configuration(id_list(str(values.get(subnets_key) or "")) or [subnet], groups)
    except NetworkError as error:
        raise NetworkUnknown(job_id, world_size,
                             f"job {job_id}: {groups_key} / {subnets_key}: {error}") from error


def registration_from_tags(task: dict[str, Any], tags: list[dict[str, str]]) -> RankRegistration:
    values = {t.get("key"): t.get("value") for t in tags}
    if TAG_JOB_ID not in values:
        raise NotProtected("task has no gpu-recovery:job-id tag")
    job_id = str(values[TAG_JOB_ID]).strip()
    try:
        world_size = int(values.get(TAG_WORLD_SIZE) or "")
        attempt = int(values.get(TAG_ATTEMPT) or 1)
        several = parse_ranks_tag(str(values.get(TAG_RANKS) or "")) if TAG_RANK not in values else []
        rank = several[0] if several else int(values.get(TAG_RANK) or "")
    except ValueError as error:
        raise NotProtected(f"malformed recovery tags: {values}") from error
    if several:
        raise StartedForSeveralRanks(job_id, max(1, attempt), several)
    if not job_id or "#" in job_id or not 0 <= rank < world_size:
        raise NotProtected(f"malformed recovery tags: {values}")
    if world_size > MAX_WORLD_SIZE:
        raise TooLarge(job_id, world_size)
    user_tags = [t for t in tags if not str(t.get("key", "")).lower().startswith("aws:")]
    if len(tags_for_attempt(user_tags, max(1, attempt))) > MAX_TASK_TAGS:
        raise TooManyTags(job_id, world_size, len(user_tags))
    gpus = sum(len(c.get("gpuIds") or []) for c in task.get("containers") or [] if isinstance(c, dict))
    subnet, network = _task_network(task, values, TAG_SECURITY_GROUPS, TAG_SUBNETS, job_id, world_size)
    return RankRegistration(
        job_id=job_id,
        rank=rank,
        world_size=world_size,
        attempt=max(1, attempt),
        task_arn=task["taskArn"],
        task_definition_arn=task.get("taskDefinitionArn", ""),
        container_instance_arn=task.get("containerInstanceArn", ""),
        overrides=dict(task.get("overrides") or {}),
        tags=[{"key": str(t["key"]), "value": str(t.get("value", ""))} for t in tags],
        group=task.get("group", ""),
        started_by=task.get("startedBy", ""),
        max_recovery_attempts=_budget_tag(values, TAG_MAX_INFRA_RECOVERIES),
        max_app_restarts=_budget_tag(values, TAG_MAX_APP_RESTARTS),
        gpus=gpus,
        subnet=subnet,
        network=network,
        created_at=task_time(task, "createdAt"),
    )


def registration_from_event(task: dict[str, Any]) -> RankRegistration | None:
    """A rank from its ECS task state-change event alone (the convention: ``group``
    ``gpu-recovery:<job-id>``, RANK and WORLD_SIZE in the container environment, ATTEMPT
    optional). None when the task does not follow it (or names a job without its rank: a
    grouped start, found by its tags); NotProtected when it does, malformed."""
    job_id = convention_job_id(str(task.get("group") or ""))
    if not job_id:
        return None
    env = container_environment(dict(task.get("overrides") or {}))
    if ENV_VAR_RANK not in env:
        return None
    try:
        rank = int(env[ENV_VAR_RANK])
        world_size = int(env.get(ENV_VAR_WORLD_SIZE) or "")
        attempt = int(env.get(ENV_VAR_ATTEMPT) or 1)
    except ValueError as error:
        raise NotProtected(f"malformed convention environment of job {job_id}: {env}") from error
    if "#" in job_id or not 0 <= rank < world_size:
        raise NotProtected(f"malformed convention environment of job {job_id}: rank {rank} of {world_size}")
    if world_size > MAX_WORLD_SIZE:
        raise TooLarge(job_id, world_size)
    gpus = sum(len(c.get("gpuIds") or []) for c in task.get("containers") or [] if isinstance(c, dict))
    relocatable = env.get(ENV_VAR_RELOCATABLE, "").strip().lower() == "true"
    subnet, network = _task_network(task, env, ENV_VAR_SECURITY_GROUPS, ENV_VAR_SUBNETS, job_id, world_size)
    return RankRegistration(
        job_id=job_id, rank=rank, world_size=world_size, attempt=max(1, attempt),
        task_arn=str(task["taskArn"]), task_definition_arn=str(task.get("taskDefinitionArn") or ""),
        container_instance_arn=str(task.get("containerInstanceArn") or ""),
        overrides=dict(task.get("overrides") or {}),
        tags=[{"key": TAG_RELOCATABLE, "value": "true"}] if relocatable else [],
        group=str(task.get("group") or ""), started_by=str(task.get("startedBy") or ""),
        max_recovery_attempts=_budget_tag(env, ENV_VAR_MAX_INFRA_RECOVERIES),
        max_app_restarts=_budget_tag(env, ENV_VAR_MAX_APP_RESTARTS), gpus=gpus, subnet=subnet,
        network=network, created_at=task_time(task, "createdAt"))


def overrides_for_attempt(overrides: dict[str, Any], attempt: int) -> dict[str, Any]:
    """``overrides`` with the convention's ATTEMPT set to ``attempt`` wherever a container
    override carries it (a restarted task's event then names its own attempt)."""

    def is_attempt(entry: Any) -> bool:
        return isinstance(entry, dict) and entry.get("name") == ENV_VAR_ATTEMPT

    containers = (overrides or {}).get("containerOverrides") or []
    if not any(isinstance(c, dict) and any(is_attempt(e) for e in c.get("environment") or [])
               for c in containers):
        return overrides
    updated = []
    for container in containers:
        if isinstance(container, dict) and container.get("environment"):
            container = {**container, "environment": [{**e, "value": str(attempt)} if is_attempt(e) else e
                                                      for e in container["environment"]]}
        updated.append(container)
    return {**overrides, "containerOverrides": updated}


def _budget_tag(values: dict[Any, Any], key: str) -> int | None:
    """A per-job budget tag; a malformed one is ignored (the deployment's default applies)."""
    raw = str(values.get(key) or "").strip()
    if not raw.isdigit() or int(raw) > MAX_BUDGET:
        if raw:
            logger.warning("ignoring malformed budget tag", extra={"tag": key, "value": raw})
        return None
    return int(raw)


def restart_started_by(job_id: str, attempt: int, rank: int) -> str:
    """Deterministic per attempt and rank (``domain.started_by``): finds duplicates."""
    return task_started_by.rank_launch(task_started_by.RESTART, job_id, attempt, f"r{rank}", digest=10)


def group_started_by(job_id: str, attempt: int, call: StartCall) -> str:
    """A restart's StartTask of identical ranks (``domain.launch_plan``): deterministic per
    attempt and call; a call of one rank is that rank's own."""
    if not call.grouped:
        return restart_started_by(job_id, attempt, call.key)
    return task_started_by.rank_launch(task_started_by.RESTART, job_id, attempt, f"g{call.key}", digest=10)


def tags_for_attempt(tags: list[dict[str, str]], attempt: int) -> list[dict[str, str]]:
    kept = [t for t in tags if t.get("key") != TAG_ATTEMPT]
    return [*kept, {"key": TAG_ATTEMPT, "value": str(attempt)}]


class RankJobs(Protocol):
    """A rank and its job."""

    def get_job(self, job_id: str) -> Job | None: ...
    def get_rank(self, job_id: str, rank: int) -> Rank | None: ...


class RankNodes(Protocol):
    """A rank's node: read, registered, its EC2 id recorded."""

    def get_instance(self, container_inst_id: str) -> Instance | None: ...
    def put_instance_if_absent(self, instance: Instance) -> bool: ...
    def record_ec2_instance_id(self, inst_id: str, ec2_instance_id: str) -> bool: ...


class RankData(Protocol):
    """A rank's job and node, and its latch arrival (its registration's own intents are
    ``repo.registrations``)."""

    faults: FaultRepository
    latches: LatchRepository

    @property
    def jobs(self) -> RankJobs: ...
    @property
    def instances(self) -> RankNodes: ...


@dataclass(eq=False, repr=False)
class RankOperations:
    """``tag_lookups``: the tag lookup worker's queue (unknown tasks' events described
    together), or None (each looked up here)."""

    data: RankData
    records: RegistrationRepository
    ecs: EcsPort
    notices: Notices  # e-mails, owed with the decision they report
    _: KW_ONLY
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings
    tag_lookups: GangQueuePort | None = None
    reactions: Reactions = field(default_factory=Reactions)  # told: a recovering job's rank found

    # ------------------------------------------------------------- registration
    def register_rank(self, reg: RankRegistration) -> Rank:
        """Protect a rank: the task handler calls it on RUNNING, the queue at launch."""
        repo = self.data
        now = clock.now()
        inst_id = container_instance_id(reg.container_instance_arn)
        # No DescribeContainerInstances here (a job of 1,024 nodes starting at once would spend
        # the account's Describe rate on it): a node action resolves a missing id first.
        known = None if reg.ec2_instance_id else repo.instances.get_instance(inst_id)
        ec2_id = reg.ec2_instance_id or (known.ec2_instance_id if known else "")
        repo.instances.put_instance_if_absent(
            Instance(inst_id, container_instance_arn=reg.container_instance_arn, ec2_instance_id=ec2_id)
        )
        max_attempts = (reg.max_recovery_attempts if reg.max_recovery_attempts is not None
                        else self.settings.max_recovery_attempts)
        max_app = (reg.max_app_restarts if reg.max_app_restarts is not None
                   else self.settings.max_app_restarts)
        relocatable = _tag_relocatable(reg.tags)
        created = self.records.create_job_if_absent(Job(
            job_id=reg.job_id,
            state=JobState.RUNNING if reg.state is RankState.RUNNING else JobState.STARTING,
            world_size=reg.world_size, attempt=reg.attempt, max_recovery_attempts=max_attempts,
            max_app_restarts=max_app, created_at=now, updated_at=now, relocatable_tags=relocatable,
            network=reg.network,
        ))
        if not created and not relocatable and reg.tags:
            job = repo.jobs.get_job(reg.job_id)
            if job is not None and job.relocatable_tags and not job.is_queue_job:
                self.records.mark_not_relocatable(reg.job_id)
        # A later attempt (the queue starting a suspended or requeued job again) keeps the
        # rank's earlier tasks on its item: their logs stay readable by attempt. Read before
        # the put instead of after it (the same two calls); attempt 1 has none to keep.
        previous = repo.jobs.get_rank(reg.job_id, reg.rank) if reg.attempt > 1 else None
        rank = Rank(
            job_id=reg.job_id, rank=reg.rank, state=reg.state, attempt=reg.attempt,
            task_arn=reg.task_arn, task_definition_arn=reg.task_definition_arn,
            container_inst_id=inst_id, container_instance_arn=reg.container_instance_arn,
            ec2_instance_id=ec2_id, overrides=reg.overrides, tags=_tags_kept(reg, previous), group=reg.group,
            started_by=reg.started_by, registered_at=min(reg.created_at or now, now), gpus=reg.gpus,
            subnet=reg.subnet,
            earlier_tasks=previous.tasks_before(reg.attempt) if previous is not None else (),
        )
        # Tried once more at once when a call fails: a redelivery finds the rank written and
        # stops there, so an arrival lost here would be lost for good (the attempt's latch
        # without the rank and its node, which a fault's reservation and a restart read).
        return twice(partial(self._write_registration, reg, rank, previous))

    def _write_registration(self, reg: RankRegistration, rank: Rank, previous: Rank | None) -> Rank:
        """The rank's item (unless the table has this task or a newer attempt), then, if it is
        this task's, its arrival at the attempt's registered latch with its node."""
        repo = self.data
        written = self.records.put_rank_registration(rank)
        if written:
            logger.info("rank registered", extra={"job_id": reg.job_id, "rank": reg.rank,
                                                  "attempt": reg.attempt, "task": reg.task_arn})
        stored = (rank if written and previous is not None
                  else (repo.jobs.get_rank(reg.job_id, reg.rank) or rank))
        if stored.attempt == reg.attempt and stored.task_arn == reg.task_arn:
            repo.latches.arrive(reg.job_id, reg.attempt, reg.world_size, reg.rank, [Latch.REGISTERED],
                                node=rank.container_inst_id, registered_at=stored.registered_at)
        return stored

    def register_restarted(self, job: Job, previous: Rank, *, task_arn: str, container_instance_arn: str,
                           ec2_instance_id: str, started_by: str,
                           registered_at: float | None = None) -> Arrival:
        """The gang restart started ``previous``'s rank again (job, instance and budgets are
        known): write the new attempt's rank and arrive at its registered latch. ``registered_at``:
        when its task was started, if before now (found started by a dead holder of its lease)."""
        repo = self.data
        inst_id = container_instance_id(container_instance_arn)
        if inst_id != previous.container_inst_id:  # relocated: the new node may be unknown
            repo.instances.put_instance_if_absent(Instance(
                inst_id, container_instance_arn=container_instance_arn, ec2_instance_id=ec2_instance_id))
        rank = Rank(
            job_id=job.job_id, rank=previous.rank, state=RankState.STARTING, attempt=job.attempt,
            task_arn=task_arn, task_definition_arn=previous.task_definition_arn, container_inst_id=inst_id,
            container_instance_arn=container_instance_arn, ec2_instance_id=ec2_instance_id,
            overrides=overrides_for_attempt(previous.overrides, job.attempt),
            tags=tags_for_attempt(previous.tags, job.attempt),
            group=previous.group,
            started_by=started_by, registered_at=min(registered_at or clock.now(), clock.now()),
            gpus=previous.gpus,
            earlier_tasks=previous.tasks_before(job.attempt))
        self.records.put_rank_registration(rank)
        return repo.latches.arrive(job.job_id, job.attempt, job.world_size, rank.rank, [Latch.REGISTERED],
                                   node=inst_id, registered_at=rank.registered_at)

    def ec2_instance_id(self, instance: Instance) -> str:
        """The node's EC2 / managed instance id: the instance item's, else described once
        (DescribeContainerInstances) and recorded on the item."""
        if instance.ec2_instance_id:
            return instance.ec2_instance_id
        described = self.ecs.describe_container_instance(
            instance.container_instance_arn or instance.container_inst_id)
        ec2_id = str((described or {}).get("ec2InstanceId", ""))
        if ec2_id:
            self.data.instances.record_ec2_instance_id(instance.container_inst_id, ec2_id)
        return ec2_id

    def rank_for_task(self, detail: EcsTaskDetail) -> Rank | None:
        """The task's rank: the one its event names if that rank records this task, else
        known by its task, else registered from its event (the convention), else from its
        tags (one DescribeTasks, once per task: a task found not protected is remembered, so
        its later events cost no DescribeTasks)."""
        repo = self.data
        mode = self.settings.registration
        named = convention_rank(detail.group, detail.overrides) if mode != "tags" else None
        if named is not None:
            # The rank the event names, by key: one GetItem and no index query when it
            # records this task (the common case); anything else is looked up by the task.
            rank = repo.jobs.get_rank(*named)
            if rank is not None and rank.task_arn == detail.taskArn:
                return rank
        known = self.records.look_up_task(detail.taskArn)
        if known.rank is not None:
            return known.rank
        if mode != "tags":
            try:
                reg = registration_from_event(detail.model_dump())
            except Refused as refused:
                self.refuse(refused)
                return None
            except NotProtected as reason:
                logger.warning("task names a job but is not protected", extra={
                    "task": detail.taskArn, "why": str(reason)})
                return None
            if reg is not None:
                return self.register_rank(reg)
            if mode == "convention":
                return None
        if known.unprotected:
            return None
        # Unknown task: out-of-order delivery, index lag, or a job launched by another
        # tool. Tags decide, and only DescribeTasks(include=TAGS) returns them: the tag
        # lookup worker describes 100 tasks a call under the stack's Describe budget.
        if self.tag_lookups is not None:
            self.tag_lookups.send([{"detail": detail.model_dump(mode="json")}])
            raise LookupQueued(detail.taskArn)
        task = self.ecs.describe_task(detail.taskArn)
        if task is None:
            # Answered MISSING for a task whose event is in hand: ECS has not caught up (it
            # keeps a stopped task describable for an hour). Not "unprotected": the event
            # fails and is delivered again.
            raise EcsActionFailed.missing("DescribeTasks", [detail.taskArn])
        return self.rank_from_description(detail.taskArn, task)

    def look_up_tags(self, task_arns: Iterable[str]) -> dict[str, Rank | Exception | None]:
        """The ranks of tasks whose tags decide (the tag lookup worker's batch): known ones
        from the table, the rest described together (DescribeTasks takes 100: its failure fails
        the batch). A task ECS answers MISSING is left out (its event fails and is delivered
        again, see ``rank_for_task``); a task whose own read or registration failed is answered
        with its error, its event alone delivered again (a batch failed by any one task's call
        came back whole, each time with the same odds, and was dead-lettered after its tenth
        receive: soak at 6 % of calls failing)."""
        resolved: dict[str, Rank | Exception | None] = {}
        unknown: list[str] = []
        for arn in dict.fromkeys(task_arns):
            try:
                known = self.records.look_up_task(arn)
            except Exception as error:
                resolved[arn] = error
                continue
            if known.rank is not None or known.unprotected:
                resolved[arn] = known.rank
            else:
                unknown.append(arn)
        if unknown:
            described = {str(t.get("taskArn")): t for t in self.ecs.describe_tasks(unknown)}
            for arn in unknown:
                if arn in described:
                    try:
                        resolved[arn] = self.rank_from_description(arn, described[arn])
                    except Exception as error:
                        resolved[arn] = error
        return resolved

    def rank_from_description(self, task_arn: str, task: dict[str, Any] | None) -> Rank | None:
        """Register the described task by its tags, or remember that it is not protected."""
        if task is None:
            return None
        try:
            reg = registration_from_tags(task, task.get("tags", []))
        except Refused as refused:
            self.refuse(refused)
            return None
        except StartedForSeveralRanks as several:
            return self._rank_of_grouped_task(task, several)
        except NotProtected as reason:
            logger.debug("task not protected", extra={"task": task_arn, "why": str(reason)})
            self.records.remember_unprotected_task(task_arn, clock.now())
            return None
        return self.register_rank(reg)

    def _rank_of_grouped_task(self, task: dict[str, Any], several: StartedForSeveralRanks) -> Rank | None:
        """A task a grouped StartTask started whose registration has not landed yet: its rank
        is the one of the call planned on its node (a gang restart's; the launcher registers
        it as well, and the first registration wins)."""
        repo = self.data
        job = repo.jobs.get_job(several.job_id)
        if job is None or job.attempt != several.attempt:
            return None
        node = container_instance_id(str(task.get("containerInstanceArn", "")))
        moves = repo.faults.placement(job.job_id, job.attempt) if job.relocated else {}
        for number in several.ranks[:10]:
            rank = repo.jobs.get_rank(job.job_id, number)
            if rank is None:
                continue
            if rank.attempt == job.attempt and rank.task_arn == task.get("taskArn"):
                return rank
            planned = (moves.get(rank.container_inst_id) or {}).get("node", rank.container_inst_id)
            if rank.attempt == job.attempt - 1 and planned == node:
                self.register_restarted(
                    job, rank, task_arn=str(task["taskArn"]),
                    container_instance_arn=str(task.get("containerInstanceArn", "")),
                    ec2_instance_id=rank.ec2_instance_id if planned == rank.container_inst_id else "",
                    started_by=str(task.get("startedBy", "")), registered_at=task_time(task, "createdAt"))
                return repo.jobs.get_rank(job.job_id, number)
        return None

    def all_registered(self, job: Job) -> bool:
        """Every rank of the job's attempt registered (its registered latch complete)."""
        return Latch.REGISTERED in self.data.latches.complete(job.job_id, job.attempt, job.world_size)

    def register_missing(self, job: Job) -> bool:
        """Ranks whose RUNNING event never arrived, found by their tags, running or stopped,
        and registered (so they are stopped and restarted too; a job in recovery has their
        nodes reserved with its own first: its fault did not know them, and their stop frees
        them). A rank found stopped may have lost its STOPPED event too (soak seed 7157: a
        rank's fault whose two events were dead-lettered, its node free for another job's
        rank 19 s later): its node is reserved all the same, and the stop's next round finds it
        STOPPED and handles it as that event (``recovery.lost_stop_events``). Costs a ListTasks
        per status and a DescribeTasks per 100 tasks of the cluster: only when the attempt's
        registered latch is incomplete. False when a job in recovery had ranks found whose nodes
        could not be reserved: its stop waits. Tried again at once when a call fails: a stopped
        rank's node is free now, and the sweep's minute comes too late (soak seed 7157: the
        latch's read throttled, another job's rank on that node 14 s later)."""
        return twice(lambda: self._register_missing(job))

    def _register_missing(self, job: Job) -> bool:
        repo = self.data
        if self.all_registered(job):
            return True
        known = repo.latches.registered(job.job_id, job.attempt, job.world_size)
        found = []
        for task in self.ecs.tasks_tagged(TAG_JOB_ID, job.job_id):
            try:
                reg = registration_from_tags(task, task.get("tags", []))
            except NotProtected:
                continue
            if reg.rank not in known and reg.attempt == job.attempt:  # a running task first
                logger.info("registering a rank found by its tags", extra={
                    "job_id": job.job_id, "rank": reg.rank, "task": reg.task_arn,
                    "last_status": task.get("lastStatus")})
                self.register_rank(reg)
                known.add(reg.rank)
                found.append(reg.rank)
        # Their nodes reserved before the stop frees them, or no stop yet (the sweep's reserves
        # first, then finds them registered): as for the fault's own (``reserved_first``).
        return not found or job.state not in RECOVERING_JOB_STATES \
            or reserved_first(self.reactions, job, sending=True)

    def refuse(self, refused: Refused) -> None:
        """A job the loop cannot protect: a WARNING every time, a metric and an e-mail once."""
        logger.warning(refused.log_message, extra={
            "job_id": refused.job_id, "world_size": refused.world_size, "why": str(refused),
            "max_world_size": MAX_WORLD_SIZE})
        notice = self.notices.for_facts(NotificationKind.JOB_REFUSED, refused.headline, NotificationFacts(
            job_id=refused.job_id,
            what_happened=str(refused),
            what_was_done="Nothing: its ranks are not registered, a GPU fault in this job is not recovered",
            operator_action=refused.operator_action))
        now = clock.now()
        if not self.records.mark_refused(refused.job_id, refused.world_size, now,
                                         also=self.notices.owe([notice], now)):
            return
        self.metrics.add_metric("JobsRefused", "Count", 1)
        self.notices.send([notice])


def _tags_kept(reg: RankRegistration, previous: Rank | None) -> list[dict[str, str]]:
    """The rank's tags for its registration: the registration's own, and the earlier attempt's
    it does not carry (an event registered by the convention carries none: the launcher's tags,
    which the next restart starts the rank with, must not be lost with it)."""
    if previous is None or not previous.tags:
        return reg.tags
    own = {t.get("key") for t in reg.tags}
    kept = [t for t in previous.tags if t.get("key") not in own]
    if TAG_ATTEMPT in own or not any(t.get("key") == TAG_ATTEMPT for t in kept):
        return [*kept, *reg.tags]
    return tags_for_attempt([*kept, *reg.tags], reg.attempt)


def _tag_relocatable(tags: list[dict[str, str]]) -> bool:
    return any(t.get("key") == TAG_RELOCATABLE and str(t.get("value", "")).lower() == "true" for t in tags)


