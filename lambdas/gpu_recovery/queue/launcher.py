"""Launch an admitted queue job on ECS: claim, StartTask per rank, register, or roll back.

Exactly once per attempt
------------------------
1. **Claim**: one conditional write moves the job QUEUED/PENDING_RESOURCES ->
   STARTING with ``attempt + 1``, removes it from the queue index and records the
   launch plan (node per rank, MASTER_ADDR/PORT). Only one tick can win the claim.
2. **Start**: rank by rank, ``StartTask`` on the planned container instance with a
   deterministic ``startedBy`` (``q-<sha256(job_id)[:12]>-a<attempt>-r<rank>``), then
   ``RecoveryService.register_rank`` right away (the recovery loop owns it from then).
3. **Finish**: a conditional write marks the launch complete (``launched_at``) and
   appends the attempt entry. If the job was canceled or ended meanwhile, the ranks
   just started are stopped.

A tick that dies anywhere in step 2 leaves the job in STARTING without
``launched_at``; the next tick (after ``stale_launch_seconds``) *resumes* it: for each
rank not registered for the attempt, ``ListTasks(startedBy)`` first (register the task
found), ``StartTask`` only when none exists. No rank is ever started twice.

Failures: a placement failure (``RESOURCE:GPU`` ...) or a vanished node is
INSUFFICIENT_RESOURCES: the job goes back to PENDING_RESOURCES with its original (a relocated
job's ahead of its priority) ``queue_order`` and ``not_before = now + backoff`` (60 s doubling to
10 min), then its started ranks are stopped. A task-definition / override error is
USER_ERROR: FAILED, never retried. Throttling and other unknown errors are treated like a
crash (resumed later, at most ``max_launch_resumes`` times). A launch that ended short
leaves the ledger once ECS took every stop (``_leave_ledger``): until then the next tick
resumes it first and stops what is still live.

AWS is reached through the adapters ``runtime.queue_scheduler`` builds (``EcsAdapter``,
``TaskDefinitions``, ``HostAddresses``). They pass AWS errors through as botocore raised
them (an unknown task definition as ``TaskDefinitionNotFound``): the classification by
error code above is the launcher's, in ``admission.classify_failure``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery import clock
from gpu_recovery.adapters.task_definitions import TaskDefinitionNotFound
from gpu_recovery.constants import (
    CONTROL_TOKEN_ENV,
    CONTROL_URL_ENV,
    RESUME_COUNT_ENV,
    SYSTEM_STOP_REASON_PREFIX,
    TAG_ATTEMPT,
    TAG_JOB_ID,
    TAG_RANK,
    TAG_WORLD_SIZE,
    JobState,
    RankState,
    job_group,
    queue_order,
    relocated_queue_order,
)
from gpu_recovery.domain import started_by as task_started_by
from gpu_recovery.domain.control_token import make_token
from gpu_recovery.domain.models import Job, Rank, container_instance_id
from gpu_recovery.domain.states import ENDING_JOB_STATES, LIVE_RANK_STATES, STARTED_JOB_STATES
from gpu_recovery.domain.task_network import restart_network
from gpu_recovery.queue.admission import (
    FailureKind,
    backoff_seconds,
    classify_failure,
    queued_relocated,
)
from gpu_recovery.queue.attempts import last_suspend, relocation_record, with_entry
from gpu_recovery.recovery import RankRegistration
from gpu_recovery.recovery.task_starts import StartsTasks, TaskRequest, start_once
from gpu_recovery.repository import from_ddb
from gpu_recovery.repository.records import job_from_item
from gpu_recovery.repository.scheduling import SchedulingRepository
from gpu_recovery.repository.time_sharing import ChargeClaim
from gpu_recovery.settings import TimeSharingSettings

logger = logging.getLogger(__name__)

DEFAULT_MASTER_PORT = 29500
# A launch stops starting ranks this long before its tick's budget is spent.
LAUNCH_TIME_MARGIN_SECONDS = 10.0
# Container-instance attribute an operator can set (ECS_INSTANCE_ATTRIBUTES) to give a
# node's address explicitly, e.g. for ECS Anywhere hosts.
HOST_ADDRESS_ATTRIBUTE = "gpu-recovery.host-address"


def started_by(job_id: str, attempt: int, rank: int) -> str:
    """Deterministic per attempt and rank (``domain.started_by``)."""
    return task_started_by.rank_launch(task_started_by.QUEUE_LAUNCH, job_id, attempt, f"r{rank}", digest=12)


class LaunchError(Exception):
    """A start failed in a way that ends the attempt (classified)."""

    def __init__(self, kind: FailureKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


# ------------------------------------------------------------------------ spec
@dataclass(frozen=True)
class LaunchSpec:
    """What launching a stored job needs, read from its item: the submitted spec
    (``spec_json``, a :class:`gpu_recovery.queue.models.JobSpec` as it was stored) with the
    item's own world size and GPUs per node, the rendezvous port resolved."""

    task_definition: str
    nnodes: int
    gpus_per_node: int
    container_name: str = ""
    command: list[str] | None = None
    environment: dict[str, str] = field(default_factory=dict)
    master_port: int = DEFAULT_MASTER_PORT

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> LaunchSpec:
        raw = item.get("spec_json") or "{}"
        spec = json.loads(raw) if isinstance(raw, str) else dict(raw)
        overrides = spec.get("overrides") or {}
        env_in = overrides.get("environment") or {}
        if isinstance(env_in, list):
            env = {str(e["name"]): str(e.get("value", "")) for e in env_in}
        else:
            env = {str(k): str(v) for k, v in dict(env_in).items()}
        command = overrides.get("command")
        port = spec.get("master_port") or env.get("MASTER_PORT") or DEFAULT_MASTER_PORT
        return cls(
            task_definition=str(spec["task_definition"]),
            nnodes=int(item.get("world_size") or spec.get("nnodes") or 1),
            gpus_per_node=int(item.get("gpus_per_node", spec.get("gpus_per_node", 0))),
            container_name=str(spec.get("container_name") or ""),
            command=[str(c) for c in command] if command else None,
            environment=env,
            master_port=int(port),
        )


# ------------------------------------------------------------------ ports
class TaskDefinitionPort(Protocol):
    """``adapters.task_definitions.TaskDefinitions`` (cached DescribeTaskDefinition)."""

    def describe(self, ref: str) -> dict[str, Any]: ...


class HostAddressPort(Protocol):
    """``adapters.hosts.HostAddresses``: an instance's private IP ("" when unknown)."""

    def address(self, instance_id: str) -> str: ...


class LaunchEcs(StartsTasks, Protocol):
    """The ECS calls a launch makes (``adapters.ecs.EcsAdapter``): its starts, and a stop."""

    def stop_task(self, task_arn: str, reason: str) -> None: ...


class LaunchedRanks(Protocol):
    """A launch's ranks in the recovery loop's records: the ones registered, and a stop asked
    of one (``repository.Repository``)."""

    def get_ranks(self, job: Job) -> list[Rank]: ...
    def request_rank_stop(self, rank: Rank, why: str, now: float) -> bool: ...


class RegistersRanks(Protocol):
    """Hands a started rank to the recovery loop (``recovery.RecoveryService``)."""

    def register_rank(self, reg: RankRegistration) -> Rank: ...


def first_essential_container(td: Mapping[str, Any]) -> str:
    containers = td.get("containerDefinitions") or []
    for c in containers:
        if c.get("essential", True):
            return str(c["name"])
    return str(containers[0]["name"]) if containers else ""


INSTANCE_TYPE_ATTRIBUTE = "ecs.instance-type"


def master_address(hosts: HostAddressPort, node: PlacedNode) -> str:
    """Rank 0's address for MASTER_ADDR: the node's explicit attribute (ECS Anywhere hosts
    whose SSM address is not the one peers reach), else its private IP."""
    explicit = node.attributes.get(HOST_ADDRESS_ATTRIBUTE)
    return str(explicit) if explicit else hosts.address(node.ec2_instance_id)


@dataclass(frozen=True)
class PlacedNode:
    """What the launcher needs about a node chosen by admission."""

    container_instance_arn: str
    ec2_instance_id: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass
class LaunchOutcome:
    job_id: str
    action: str  # launched | resumed | raced | skipped | requeued | failed | interrupted | ...
    attempt: int = 0
    tasks: list[str] = field(default_factory=list)
    kind: str = ""
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in ("", [], 0) or k == "action"}


# ------------------------------------------------------------------ launcher
class Launcher:
    def __init__(self, repo: LaunchedRanks, ecs: LaunchEcs, recovery: RegistersRanks,
                 task_definitions: TaskDefinitionPort,
                 hosts: HostAddressPort, store: SchedulingRepository, owner: str, *,
                 max_launch_resumes: int = 3, sharing: TimeSharingSettings | None = None) -> None:
        self.sharing = sharing or TimeSharingSettings()
        self.repo = repo
        self.store = store  # the scheduler's lease, launch ledger and launch transitions
        self.owner = owner  # the lease owner: a claim holds only while the lease is ours
        self.ecs = ecs
        self.recovery = recovery
        self.task_definitions = task_definitions
        self.hosts = hosts
        self.max_launch_resumes = max_launch_resumes

    # -------------------------------------------------------------- new launch
    def launch(self, item: Mapping[str, Any], nodes: list[PlacedNode], charge: ChargeClaim | None = None, *,
               time_left: Callable[[], float] | None = None) -> LaunchOutcome:
        """Claim the job for a new attempt on ``nodes`` (rank i on nodes[i]), with its quota
        ``charge``, and start it. A SUSPENDED job is resumed (``RESUME_COUNT`` + 1).
        ``time_left``: of the tick's budget (None: none); the launch yields short of it."""
        item = from_ddb(dict(item))
        job_id = item["job_id"]
        try:
            spec = LaunchSpec.from_item(item)
        except (KeyError, ValueError, TypeError) as error:
            return LaunchOutcome(job_id, "skipped", reason=f"malformed spec: {error}")
        master = nodes[0]
        try:
            master_addr = master_address(self.hosts, master)
        except (ClientError, BotoCoreError) as error:
            # One unreachable lookup (a terminated instance ECS still lists, throttling)
            # must not stop the whole tick: skip this job, the next tick tries again.
            logger.warning("host address lookup failed", extra={"job_id": job_id, "error": str(error)})
            return LaunchOutcome(job_id, "skipped", reason=f"no address for rank 0's host: {error}")
        if not master_addr:
            return LaunchOutcome(job_id, "skipped", reason="no address for rank 0's host")
        current = item.get("attempt")
        attempt = int(current or 0) + 1
        now = clock.now()
        node_arns = [n.container_instance_arn for n in nodes]
        ec2_ids = [n.ec2_instance_id for n in nodes]
        # The job item keeps the plan's shape; its nodes are items of their own (a 1,024-node
        # plan is ~120 KB of ARNs).
        plan = {
            "attempt": attempt,
            "world_size": len(nodes),
            "rank0_node": container_instance_id(master.container_instance_arn),
            "master_addr": master_addr,
            "master_port": spec.master_port,
            # The class the gang preflight keeps its baseline for (ECS's built-in attribute
            # of EC2 container instances; ECS Anywhere hosts have none).
            "instance_type": str(master.attributes.get(INSTANCE_TYPE_ATTRIBUTE) or ""),
            # Queued ahead of its priority (relocated): an abort requeues it there (``_abort``).
            "relocated": queued_relocated(item),
        }
        resumed = item.get("job_state") == JobState.SUSPENDED.value
        reason, moved = f"admitted: attempt {attempt} on {len(nodes)} node(s)", None
        if resumed:
            count = int(item.get("resume_count") or 0) + 1
            reason = (f"resumed (resume {count}, attempt {attempt}) on {len(nodes)} node(s)"
                      f"{last_suspend(item)}")
        elif item.get("relocation"):
            reason, moved = relocation_record(item, plan, node_arns, now)
        plan_items = self.store.plan_updates(job_id, attempt, node_arns, ec2_ids)
        if not self.store.claim_launch(job_id, None if current is None else int(current), attempt, plan, now,
                                       self.owner, reason, relocations=moved, charge=charge, resumed=resumed,
                                       plan_items=plan_items):
            return LaunchOutcome(job_id, "raced", attempt,
                                 reason="claim lost: canceled, taken, lease lost or quota full")
        item = {**item, "attempt": attempt, "launch": plan, "job_state": JobState.STARTING.value,
                "launch_claimed_at": now,
                "resume_count": int(item.get("resume_count") or 0) + (1 if resumed else 0)}
        return self._start_ranks(item, spec, attempt, plan, resume=False, nodes=(node_arns, ec2_ids),
                                 time_left=time_left)

    # ---------------------------------------------------------------- resume
    def resume(self, job_id: str, entry: Mapping[str, Any], *,
               time_left: Callable[[], float] | None = None) -> LaunchOutcome:
        """Finish (or clean up) a launch a dead tick left in the ledger."""
        attempt, resumes = int(entry.get("attempt", 0)), int(entry.get("resumes", 0))
        item = self.store.job_item(job_id)
        if item is None or int(item.get("attempt", 0)) != attempt or item.get("launched_at") is not None:
            self.store.launch_done(job_id)
            return LaunchOutcome(job_id, "ledger_cleared", attempt)
        state = JobState(item["job_state"])
        if state not in STARTED_JOB_STATES:
            # Ended, or requeued or failed by this launch's own abort: every task it started is
            # stopped. In recovery meanwhile: only the tasks this launch alone knows.
            stopped, all_stopped = self._stop_unregistered(
                item, attempt, all_ranks=state in ENDING_JOB_STATES or state is JobState.PENDING_RESOURCES)
            self._finish_cancel_if_no_rank(job_id, item, attempt)
            self._leave_ledger(job_id, all_stopped)
            return LaunchOutcome(job_id, "abandoned", attempt, stopped, reason=state.value)
        # A large launch may span a few ticks (each within its time budget) by design.
        if resumes >= self.max_launch_resumes + int(item.get("world_size") or 1) // 256:
            self._stop_unregistered(item, attempt)  # the registered ranks are the abort's to stop
            return self._abort(item, attempt, list(self._registered_ranks(item, attempt).values()),
                               FailureKind.UNKNOWN, f"launch did not complete after {resumes} resume(s)")
        self.store.bump_resumes(job_id)
        try:
            spec = LaunchSpec.from_item(item)
        except (KeyError, ValueError, TypeError) as error:
            return self._abort(item, attempt, [], FailureKind.USER_ERROR, f"malformed spec: {error}")
        outcome = self._start_ranks(item, spec, attempt, item.get("launch") or {}, resume=True,
                                    time_left=time_left)
        if outcome.action == "launched":
            outcome.action = "resumed"
        return outcome

    def _stop_unregistered(self, item: Mapping[str, Any], attempt: int, *,
                           all_ranks: bool = False) -> tuple[list[str], bool]:
        """Stop this attempt's tasks found by startedBy (registered ones too with ``all_ranks``):
        the tasks, and whether ECS took every registered one's stop (``_stop``)."""
        job_id = item["job_id"]
        world_size = int((item.get("launch") or {}).get("world_size") or item.get("world_size") or 1)
        registered = self._registered_ranks(item, attempt)
        all_stopped = self._stop(list(registered.values()), f"launch of attempt {attempt} abandoned") \
            if all_ranks else True
        known = {r.task_arn for r in registered.values()}
        stopped: list[str] = sorted(known) if all_ranks else []
        # Ranks start in order, each registered as soon as its StartTask answers (a resume
        # registers a rank's task found by startedBy before it starts the next): only the first
        # rank not registered may have a task no one knows. One ListTasks, whatever the size.
        unregistered = next((rank for rank in range(world_size) if rank not in registered), None)
        if unregistered is None:
            return stopped, all_stopped
        for arn in self.ecs.tasks_started_by(started_by(job_id, attempt, unregistered)):
            if arn not in known:
                self.ecs.stop_task(arn, f"{SYSTEM_STOP_REASON_PREFIX} launch of attempt {attempt} abandoned")
                stopped.append(arn)
        return stopped, all_stopped

    # ----------------------------------------------------------------- start
    def _start_ranks(self, item: dict[str, Any], spec: LaunchSpec, attempt: int, plan: Mapping[str, Any],
                     *, resume: bool, nodes: tuple[list[str], list[str]] | None = None,
                     time_left: Callable[[], float] | None = None) -> LaunchOutcome:
        job_id = item["job_id"]
        world_size = int(plan.get("world_size") or item.get("world_size") or 1)
        node_arns, ec2_ids = nodes or self.store.plan_nodes(job_id, attempt, world_size)
        registered: list[Rank] = []
        known = self._registered_ranks(item, attempt) if resume else {}
        try:
            td = self._task_definition(spec.task_definition)
            container = spec.container_name or first_essential_container(td)
            td_arn = str(td.get("taskDefinitionArn") or spec.task_definition)
            for rank in range(world_size):
                if rank in known:
                    registered.append(known[rank])
                    continue
                if time_left is not None and time_left() < LAUNCH_TIME_MARGIN_SECONDS:
                    # The tick's budget is spent: the next tick resumes it (ranks started so
                    # far are registered; the rest are looked up by startedBy first).
                    self.store.yield_launch(job_id)
                    progress = f"time budget: {len(registered)} of {world_size} ranks started"
                    return LaunchOutcome(job_id, "interrupted", attempt, [r.task_arn for r in registered],
                                         reason=progress)
                ci_arn = node_arns[rank]
                sb = started_by(job_id, attempt, rank)
                overrides = build_overrides(spec, container, job_id=job_id, rank=rank,
                                            world_size=world_size, attempt=attempt,
                                            master_addr=plan["master_addr"],
                                            master_port=int(plan.get("master_port") or spec.master_port),
                                            extra_env=self.control_env(item, rank))
                tags = rank_tags(job_id, rank, world_size, attempt)
                task_arn = self._start_one(TaskRequest(td_arn, sb, overrides, tags, job_group(job_id),
                                                       restart_network(item.get("network") or {}, [])),
                                           ci_arn, may_exist=resume)
                registered.append(self.recovery.register_rank(RankRegistration(
                    job_id=job_id, rank=rank, world_size=world_size, attempt=attempt,
                    task_arn=task_arn, task_definition_arn=td_arn, container_instance_arn=ci_arn,
                    ec2_instance_id=ec2_ids[rank] if rank < len(ec2_ids) else "",
                    overrides=overrides, tags=tags, group=job_group(job_id), started_by=sb,
                    state=RankState.STARTING,
                    max_recovery_attempts=int(item.get("max_recovery_attempts", 1)),
                    max_app_restarts=int(item.get("max_app_restarts", 0)), gpus=spec.gpus_per_node,
                )))
        except LaunchError as error:
            return self._abort(item, attempt, registered, error.kind, error.reason)
        except ClientError as error:
            err = error.response.get("Error", {})
            kind = classify_failure(error_code=str(err.get("Code", "")),
                                    error_message=str(err.get("Message", "")))
            if kind is FailureKind.UNKNOWN:
                logger.warning("launch interrupted; the next tick resumes it",
                               extra={"job_id": job_id, "attempt": attempt, "error": str(error)})
                return LaunchOutcome(job_id, "interrupted", attempt, kind=kind.value, reason=str(error))
            return self._abort(item, attempt, registered, kind, f"{err.get('Code')}: {err.get('Message')}")
        except BotoCoreError as error:
            logger.warning("launch interrupted; the next tick resumes it",
                           extra={"job_id": job_id, "attempt": attempt, "error": str(error)})
            return LaunchOutcome(job_id, "interrupted", attempt, kind=FailureKind.UNKNOWN.value,
                                 reason=str(error))
        return self._finish(item, attempt, registered)

    def control_env(self, item: Mapping[str, Any], rank: int) -> dict[str, str]:
        """What a rank needs for the suspend channel (and how often it was resumed)."""
        env = {RESUME_COUNT_ENV: str(int(item.get("resume_count") or 0))}
        secret = str(item.get("control_secret") or "")
        if secret and self.sharing.control_api_url:
            env[CONTROL_URL_ENV] = self.sharing.control_api_url
            env[CONTROL_TOKEN_ENV] = make_token(str(item["job_id"]), rank, secret)
        return env

    def _task_definition(self, ref: str) -> dict[str, Any]:
        try:
            td = self.task_definitions.describe(ref)
        except TaskDefinitionNotFound as error:
            # As classify_failure() has it for ClientException / InvalidParameterException.
            raise LaunchError(FailureKind.USER_ERROR, f"{error.code}: {error.message}") from error
        if str(td.get("status", "ACTIVE")).upper() == "INACTIVE":
            raise LaunchError(FailureKind.USER_ERROR, f"task definition {ref} is INACTIVE")
        return td

    def _start_one(self, request: TaskRequest, ci_arn: str, *, may_exist: bool) -> str:
        # The group names the job and the overrides carry RANK / WORLD_SIZE / ATTEMPT (the
        # registration convention): its events register the rank without DescribeTasks.
        # ``request.network``: the spec's, for a task definition in the awsvpc mode (checked
        # at submit). A resumed launch looks the rank's startedBy up before starting it.
        node = container_instance_id(ci_arn)
        started: list[str] = []
        unplaced = start_once(self.ecs, request, {node: ci_arn}, lambda _, task: started.append(task),
                               look_up=[node] if may_exist else ())
        if started:
            return started[0]
        reasons = unplaced[node]
        kind = classify_failure(placement_reasons=reasons or ["UNKNOWN"])
        raise LaunchError(kind, f"StartTask on {ci_arn} failed: {', '.join(reasons) or 'no task'}")

    def _finish_cancel_if_no_rank(self, job_id: str, item: Mapping[str, Any], attempt: int) -> None:
        """CANCELING with no live registered rank: no STOPPED event will ever finish the
        cancel (the recovery loop completes it when ranks stop), so finish it here."""
        if item.get("job_state") != JobState.CANCELING.value:
            return
        if any(r.is_live for r in self._registered_ranks(item, attempt).values()):
            return
        self.store.cancel_unlaunched(job_id, "canceled before any rank of the launch was running")

    def _registered_ranks(self, item: Mapping[str, Any], attempt: int) -> dict[int, Rank]:
        job = job_from_item(item)
        return {r.rank: r for r in self.repo.get_ranks(job) if r.attempt == attempt}

    # ----------------------------------------------------------------- finish
    def _finish(self, item: dict[str, Any], attempt: int, ranks: list[Rank]) -> LaunchOutcome:
        job_id = item["job_id"]
        now = clock.now()
        entry = {"attempt": attempt, "started_at": item.get("launch_claimed_at", now), "ended_at": None,
                 "outcome": "STARTED", "failure_kind": "", "reason": ""}
        attempts = with_entry(item.get("attempts"), entry)
        done = self.store.finish_launch(job_id, attempt, attempts, now)
        tasks = [r.task_arn for r in ranks]
        if not done:
            # Canceled (or ended) while we were starting: stop what we started.
            self._leave_ledger(job_id, self._stop(ranks, "job canceled while it was being launched"))
            return LaunchOutcome(job_id, "canceled_during_launch", attempt, tasks)
        self.store.launch_done(job_id)
        logger.info("job launched", extra={"job_id": job_id, "attempt": attempt, "tasks": tasks})
        return LaunchOutcome(job_id, "launched", attempt, tasks)

    def _abort(self, item: dict[str, Any], attempt: int, ranks: list[Rank], kind: FailureKind,
               reason: str) -> LaunchOutcome:
        job_id = item["job_id"]
        now = clock.now()
        entry = {"attempt": attempt, "started_at": item.get("launch_claimed_at", now), "ended_at": now,
                 "outcome": "START_FAILED", "failure_kind": kind.value, "reason": reason[:500]}
        attempts = with_entry(item.get("attempts"), entry)
        if kind is FailureKind.INSUFFICIENT_RESOURCES:
            failures = int(item.get("resource_failures", 0)) + 1
            delay = backoff_seconds(failures)
            ordered = relocated_queue_order if (item.get("launch") or {}).get("relocated") else queue_order
            order = ordered(int(item.get("priority", 0)), float(item.get("submitted_at", 0.0)), job_id)
            applied = self.store.requeue_after_failed_launch(
                job_id, attempt, reason=f"start failed ({kind.value}): {reason}; retry in {delay} s",
                queue_order=order, not_before=now + delay, resource_failures=failures, attempts=attempts)
            action = "requeued"
        else:
            applied = self.store.fail_launch(job_id, attempt, reason=f"start failed ({kind.value}): {reason}",
                                             failure_kind=kind.value, attempts=attempts)
            action = "failed"
        # A task started but not registered (a crash window) is found by startedBy on resume.
        self._leave_ledger(job_id, self._stop(ranks, f"launch of attempt {attempt} failed ({kind.value})"))
        if not applied:
            action = "raced"
            # Typically a cancel that landed during the launch.
            fresh = self.store.job_item(job_id)
            if fresh is not None:
                self._finish_cancel_if_no_rank(job_id, fresh, attempt)
        logger.warning("launch failed", extra={"job_id": job_id, "attempt": attempt,
                                               "kind": kind.value, "reason": reason, "action": action})
        return LaunchOutcome(job_id, action, attempt, [r.task_arn for r in ranks], kind.value, reason)

    def _stop(self, ranks: list[Rank], why: str) -> bool:
        """Stop a launch's ranks; whether ECS took every stop (a refused or lost one is asked
        again by the next tick: see ``_leave_ledger``)."""
        all_stopped = True
        for rank in ranks:
            if rank.state in LIVE_RANK_STATES:
                self.repo.request_rank_stop(rank, why, clock.now())
            try:
                self.ecs.stop_task(rank.task_arn, f"{SYSTEM_STOP_REASON_PREFIX} {why}")
            except (ClientError, BotoCoreError):
                logger.exception("could not stop a rank", extra={"task": rank.task_arn})
                all_stopped = False
        return all_stopped

    def _leave_ledger(self, job_id: str, all_stopped: bool) -> None:
        """A launch that ended short leaves the ledger once every task it started is stopped.
        Until then its entry stays, for the next tick to resume first (before the job may be
        admitted again), whose resume stops every rank still live: a stop ECS refused, or a tick
        that died between the launch's end and its stops, leaves no task running."""
        if all_stopped:
            self.store.launch_done(job_id)
        else:
            self.store.yield_launch(job_id)


def rank_tags(job_id: str, rank: int, world_size: int, attempt: int) -> list[dict[str, str]]:
    return [
        {"key": TAG_JOB_ID, "value": job_id},
        {"key": TAG_RANK, "value": str(rank)},
        {"key": TAG_WORLD_SIZE, "value": str(world_size)},
        {"key": TAG_ATTEMPT, "value": str(attempt)},
    ]


def build_overrides(spec: LaunchSpec, container: str, *, job_id: str, rank: int, world_size: int,
                    attempt: int, master_addr: str, master_port: int,
                    extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """ECS ``overrides``: the job's command/environment plus the rendezvous variables
    (and ``extra_env``: the suspend channel, ``RESUME_COUNT``).

    The GPU resource requirement is set to ``gpus_per_node`` so ECS reserves exactly
    what admission counted.
    """
    env = {
        **spec.environment,
        **(extra_env or {}),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "JOB_ID": job_id,
        "ATTEMPT": str(attempt),
    }
    override: dict[str, Any] = {
        "name": container,
        "environment": [{"name": k, "value": v} for k, v in sorted(env.items())],
    }
    if spec.command:
        override["command"] = list(spec.command)
    if spec.gpus_per_node > 0:
        override["resourceRequirements"] = [{"type": "GPU", "value": str(spec.gpus_per_node)}]
    return {"containerOverrides": [override]}
