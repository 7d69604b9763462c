"""Records of the recovery loop, as plain dataclasses (the repository maps them to items)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpu_recovery.domain.breaker.hold import BreakerHold
from gpu_recovery.domain.fault_tally import FaultTally
from gpu_recovery.domain.relocation import RelocationWait
from gpu_recovery.domain.restart_wait import RestartWait
from gpu_recovery.domain.states import InstanceState, JobState, RankState, SuspectVerdict


def container_instance_id(arn_or_id: str) -> str:
    """``arn:aws:ecs:r:a:container-instance/cluster/ID`` -> ``ID`` (ids pass through)."""
    return arn_or_id.rsplit("/", 1)[-1]


def task_id(task_arn: str) -> str:
    return task_arn.rsplit("/", 1)[-1]


def task_time(task: Mapping[str, Any], *fields: str) -> float | None:
    """The first of a described task's ``fields`` (``startedAt``, ``createdAt``) it holds, epoch
    seconds: a rank registered late or found by a look-up is dated from ECS's own record."""
    value = next((task[name] for name in fields if task.get(name)), None)
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value) if isinstance(value, int | float) else None


def family_of(task_definition: str) -> str:
    """``arn:...:task-definition/<family>:<rev>`` or ``<family>:<rev>`` -> family."""
    tail = task_definition.rsplit("/", 1)[-1]
    return tail.split(":", 1)[0]


#: Earlier attempts' tasks a rank item keeps (the newest first out of it): each attempt's
#: log is read by its task (``gpujobs logs --attempt``); bounded, so a rank item never grows
#: with the attempts a job makes, and nothing grows with the job's ranks.
EARLIER_TASKS_KEPT = 8


@dataclass(frozen=True)
class EarlierTask:
    """The task a rank ran in an earlier attempt (its log stream is named after it)."""

    attempt: int
    task_arn: str
    task_definition_arn: str = ""



@dataclass
class Rank:
    """One ECS task of one attempt of a job."""

    job_id: str
    rank: int
    state: RankState
    attempt: int
    task_arn: str
    task_definition_arn: str
    container_inst_id: str
    container_instance_arn: str = ""
    ec2_instance_id: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    tags: list[dict[str, str]] = field(default_factory=list)
    group: str = ""
    started_by: str = ""
    exit_code: int | None = None
    stop_reason: str = ""
    # Its exit was coupled to the fault's first ones (``domain.suspects``): its node not
    # named a suspect (a redelivered stop repeats the arrival it made).
    coupled: bool = False
    last_heartbeat_at: float | None = None
    registered_at: float = 0.0
    running_at: float | None = None  # its task's RUNNING event's time (this attempt's)
    stop_requested_at: float | None = None
    # Gang restart lease: which attempt this rank is being started for, until when.
    launch_attempt: int | None = None
    launch_lease_until: float | None = None
    gpus: int = 0  # GPUs the task held (ECS gpuIds); 0: unknown
    subnet: str = ""  # its elastic network interface's subnet (awsvpc tasks; "": none)
    # The rank's tasks of earlier attempts, oldest first (at most EARLIER_TASKS_KEPT).
    earlier_tasks: tuple[EarlierTask, ...] = ()

    @property
    def is_live(self) -> bool:
        return not self.state.is_terminal

    def task_of_attempt(self, attempt: int) -> EarlierTask | None:
        """This rank's task in ``attempt`` (this one or a kept earlier one), if known."""
        if attempt == self.attempt and self.task_arn:
            return EarlierTask(self.attempt, self.task_arn, self.task_definition_arn)
        return next((t for t in self.earlier_tasks if t.attempt == attempt), None)

    def tasks_before(self, attempt: int) -> tuple[EarlierTask, ...]:
        """What the rank item of ``attempt`` keeps of this one's tasks: this item's earlier
        tasks, plus its own when it is of an earlier attempt (the newest kept)."""
        kept = tuple(t for t in self.earlier_tasks if t.attempt < attempt)
        if self.attempt < attempt and self.task_arn:
            kept += (EarlierTask(self.attempt, self.task_arn, self.task_definition_arn),)
        return kept[-EARLIER_TASKS_KEPT:]


@dataclass
class Job:
    """The job record: one per job, beside its rank items. Nothing on it grows with the
    job's size: a fault's per-node verdicts and evidence are suspect items
    (:class:`Suspect`), rank counts are latches (``domain.latch``)."""

    job_id: str
    state: JobState
    world_size: int
    attempt: int = 1
    recoveries_used: int = 0  # infrastructure recoveries used (node faults: reboot, relocation)
    max_recovery_attempts: int = 1  # infrastructure recoveries allowed
    app_restarts_used: int = 0  # application-error restarts used
    max_app_restarts: int = 0
    fault_started_at: float | None = None
    last_error: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    source: str = "ecs-tags"  # "ecs-tags" (registered from task tags) or "queue"
    restarted_attempt: int | None = None  # the attempt the recovery loop's gang restart started
    restart_ran_marked: bool = False  # rank 0's RUNNING marked when this attempt's restart ran
    # The current fault's verdicts, as counts (the per-node records are suspect items).
    tally: FaultTally = field(default_factory=FaultTally)
    relocate: bool = False  # the pending restart moves ranks off unusable nodes
    relocated: bool = False  # the current attempt was started elsewhere (its placement item)
    restart_reason: str = ""  # why the pending restart happens (application error, transient, ...)
    # Time sharing: the suspension in progress (kind, reason, by_job, deadline_at, hold,
    # stop_requested_at once its ranks are being stopped); empty when none.
    suspend: dict[str, Any] = field(default_factory=dict)
    # Every task of the job carries gpu-recovery:relocatable=true (queue jobs: always).
    relocatable_tags: bool = False
    # Fan-out of a gang's StopTasks / StartTasks: {"attempt", "why", "at", "sent_at", "rounds"}.
    stop_fanout: dict[str, Any] = field(default_factory=dict)
    start_fanout: dict[str, Any] = field(default_factory=dict)
    # A fault of one rank's node that needed no suspect item (a restart in place, a job
    # failed on its evidence, a node lost): {"attempt", "node", "at", "evidence", "plan"}.
    last_fault: dict[str, Any] = field(default_factory=dict)
    # No healthy free node to relocate onto: the current attempt's wait for one (None: none).
    relocation_wait: RelocationWait | None = None
    # Cannot move, and a node's reboot is held back by the breaker: the current attempt's
    # wait for the breaker's reset (None: none).
    breaker_hold: BreakerHold | None = None
    hold_owed: str = ""  # BreakerHold.owed: what the restart pays for a hold never entered
    # The tasks' awsvpcConfiguration (domain.task_network; {}: not in the awsvpc mode).
    network: dict[str, Any] = field(default_factory=dict)
    # Its restart could not be placed (a node busy, its agent away, gone): the current
    # attempt's wait for its nodes (None: none; domain.restart_wait).
    restart_wait: RestartWait | None = None
    # The last checkpoint rank 0 reported (gpu_recovery_client.checkpoint_saved):
    # {"step", "at", "attempt"}; {} when none (a fault's lost work is then unknown).
    checkpoint: dict[str, Any] = field(default_factory=dict)
    # When every rank of an attempt had stopped (its stop fan-out ended): {"attempt", "at"}.
    stopped: dict[str, Any] = field(default_factory=dict)

    @property
    def suspend_stopping(self) -> bool:
        """A SUSPENDING job whose ranks are being stopped (grace over or go_suspend())."""
        return self.state is JobState.SUSPENDING and bool(self.suspend.get("stop_requested_at"))

    @property
    def restart_ran_unmarked(self) -> bool:
        """A gang restart RUNNING whose rank 0 RUNNING event has not marked when its tasks ran."""
        return self.state is JobState.RUNNING and self.restarted_attempt == self.attempt \
            and not self.restart_ran_marked

    @property
    def is_queue_job(self) -> bool:
        return self.source == "queue"

    @property
    def relocatable(self) -> bool:
        """May move to other nodes: queue jobs always; tag-registered jobs only when every
        rank's task carries ``gpu-recovery:relocatable=true`` (kept on the job item as ranks
        register)."""
        return self.is_queue_job or self.relocatable_tags

    @property
    def in_fault(self) -> bool:
        """The tally counts a fault of the current attempt."""
        return self.tally.attempt == self.attempt


@dataclass
class Suspect:
    """One node suspected in one fault of a job: its verdict, the evidence and decision,
    and the ranks that failed there (item ``<job>#S#a<attempt>#<node>``)."""

    job_id: str
    attempt: int
    node: str  # container instance id
    verdict: SuspectVerdict = SuspectVerdict.PENDING
    findings: dict[str, Any] = field(default_factory=dict)  # the verdict's JSON (DCGM or fast path)
    record: dict[str, Any] = field(default_factory=dict)  # {"at", "evidence", "plan", "label"}
    ranks: set[int] = field(default_factory=set)
    opened_at: float = 0.0
    rebooting: bool = False  # its reboot holds the job's gang restart back
    # Healthy, and counted off the job item on a tally shard ("healthy", or "infra" when the
    # catalog charges a restart to the infrastructure budget); "" otherwise.
    counted_on_shard: str = ""
    # Its node's validation after repair, once it let the job go (domain.validation
    # result_record, or {"result": "off"}); {} when the node was not repaired.
    validation: dict[str, Any] = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        return self.verdict is SuspectVerdict.PENDING


# The kinds of task the stack runs on a node, each keeping its claim in ``Instance.tasks``.
HEALTH_CHECK_TASK = "health_check"
GPU_RESET_TASK = "gpu_reset"
VALIDATION_TASK = "validation"


@dataclass(frozen=True)
class TaskClaim:
    """The claim of a task the stack runs on a node (a health check, a GPU reset, a
    validation), one shape for every kind: its ``startedBy``, committed before StartTask and
    found by ListTasks, and the task StartTask answered."""

    started_by: str = ""  # "": not claimed
    claimed_at: float | None = None  # its lease (or, for a check, its time limit) runs from here
    task_arn: str = ""  # "": not recorded (not started, or its answer lost)
    lease_until: float | None = None  # a lease kept apart (the health check's)
    attempts: int = 0  # tasks of this kind that ended without a result (where counted)


NO_CLAIM = TaskClaim()

# Why a SUSPECT node is one (``Instance.suspect_origin``): the heartbeat's lost-node
# escalation flagged it while its host still reported (its ECS agent's reconnect starts the
# stack's own check, ``recovery.lost_node_checks``); that check found a fault (kept for a person).
LOST_NODE_ORIGIN = "lost_node"
RECONNECT_CHECK_FAILED_ORIGIN = "reconnect_check_failed"
# An operator returned it (``gpu-recovery-admin return-node``): the stack's own check runs on
# it (``domain.validation.SUSPECT_CHECKS``); that check found a fault (kept for a person).
OPERATOR_RETURN_ORIGIN = "operator_return"
OPERATOR_CHECK_FAILED_ORIGIN = "operator_return_check_failed"


@dataclass
class Instance:
    """A container instance as the recovery loop sees it."""

    container_inst_id: str
    state: InstanceState = InstanceState.AVAILABLE
    container_instance_arn: str = ""
    ec2_instance_id: str = ""
    # The claims of the tasks the stack runs on it, by kind (HEALTH_CHECK_TASK, ...).
    tasks: dict[str, TaskClaim] = field(default_factory=dict)
    hc_jobs: set[str] = field(default_factory=set)  # jobs waiting for this verdict
    hc_requested_at: float | None = None
    hc_owner: str = ""  # the job whose share of health checks this running check holds
    hc_job_slot: bool = True  # it holds a slot of its owner's share (none when no share is kept)
    hc_slot_shard: int | None = None  # the shard of the cluster's slots it holds one of (None: unsharded)
    hc_slot_token: str = ""  # the token holding its slots (none: claimed by the release before, counted)
    hc_waiting_for_slot: bool = False  # no slot free: waits in its owner's queue
    # Checked only because every node of its job is (health_check_all_nodes), with no evidence
    # of its own: once its GPUs are free it waits in its owner's queue for others to start with
    # it, up to 10 a StartTask (recovery.health_checks).
    hc_grouped: bool = False
    # "<job>#<attempt>" of jobs that left before the verdict (spare first): the check is
    # still the node's, and their suspect items hold the fault's evidence.
    hc_left: set[str] = field(default_factory=set)
    reboot_requested_at: float | None = None
    reboot_claimed_at: float | None = None  # intent: a delivery is calling the reboot API
    reboot_issued_at: float | None = None  # confirmed: the reboot API answered
    # A REBOOTING node whose remediation is a GPU reset first (recovery.gpu_resets): the
    # reboot is issued only if the reset fails (its claim in ``tasks``).
    reset_pending: bool = False
    disconnected_at: float | None = None  # agent seen disconnected after the reboot request
    disconnected_version: int = 0  # that event's detail.version (0: unknown)
    disconnected_agent: str = ""  # the agent's version then (versionInfo.agentVersion)
    # The agent's first reconnect after that disconnect, when it did not prove the reboot
    # (domain.reboot_evidence.judge_return): a later disconnect replaces both.
    reconnected_at: float | None = None
    reconnected_version: int = 0
    reconnected_agent: str = ""
    boot_time: float | None = None  # the host's, as its node agent last reported it
    last_report_at: float | None = None  # the node agent's last task report (receive time)
    waiting_jobs: set[str] = field(default_factory=set)  # jobs to restart when back
    deadline_at: float | None = None
    last_verdict: dict[str, Any] = field(default_factory=dict)
    quarantine_reason: str = ""
    drain_pending: bool = False  # quarantined in the table, not yet confirmed DRAINING in ECS
    # Replacement by TerminateInstanceInAutoScalingGroup (replace_action terminate_in_asg).
    terminate_pending: bool = False
    terminate_claimed_at: float | None = None
    fault_history: list[dict[str, Any]] = field(default_factory=list)  # escalation records
    reboot_reason: str = ""
    breaker_blocked: dict[str, Any] = field(default_factory=dict)  # the node action held back
    # Known bad: no new work until healthy again (domain.cordon); {} when not cordoned.
    cordon: dict[str, Any] = field(default_factory=dict)
    cordon_version: float | None = None  # the last cordon / uncordon intent (its sync's version)
    # A rank stopped here with fault evidence ({"job", "attempt", "at"}, written with the
    # rank's stop): a suspect, out of the stack's placements until its check (the node
    # decision) says otherwise, whatever its state says meanwhile (domain.placement).
    suspect_fence: dict[str, Any] = field(default_factory=dict)
    # Why it is SUSPECT (LOST_NODE_ORIGIN, ...; "": not said). Set with the flag, dropped by
    # any other change of state (``RecoveryTables.instance_update``).
    suspect_origin: str = ""
    # The driver's warning (domain.gpu_warnings.warning_record): a repair due once its jobs
    # left, the jobs asked to move meanwhile; {} when none.
    warning: dict[str, Any] = field(default_factory=dict)
    # AWS's notice that the node goes away (domain.aws_notices): its jobs moved off before then.
    notice: dict[str, Any] = field(default_factory=dict)
    # Back from its repair and proving itself under load (domain.validation): {"repair",
    # "cause", "since", "until", "level", "load_seconds", "attempts", and the task's claim:
    # "started_by", "claimed_at", "task_arn"}; {} when not validating. The node stays
    # REBOOTING meanwhile: every job waiting for it keeps waiting, nothing places on it. A
    # lost node SUSPECT until its ECS agent reconnected runs the same check, staying SUSPECT.
    validation: dict[str, Any] = field(default_factory=dict)
    last_validation: dict[str, Any] = field(default_factory=dict)  # the last one's result
    # Terminated in its Auto Scaling group: the node the group launches in its place is
    # validated once it registers ({"since", "until", "group"}; {} when none is awaited).
    replacement_watch: dict[str, Any] = field(default_factory=dict)

    def task(self, kind: str) -> TaskClaim:
        """The claim of its task of ``kind`` (NO_CLAIM: none)."""
        return self.tasks.get(kind, NO_CLAIM)

    @property
    def check(self) -> TaskClaim:
        """The claim of its health check (the kind most stages read)."""
        return self.task(HEALTH_CHECK_TASK)

    @property
    def validating(self) -> bool:
        """Repaired (or a lost node's ECS agent reconnected: SUSPECT), its validation not
        passed yet (recovery.validations)."""
        return self.state in (InstanceState.REBOOTING, InstanceState.SUSPECT) and bool(self.validation)

    @property
    def lost_node_suspect(self) -> bool:
        """SUSPECT because the lost-node escalation flagged it (its host still reported)."""
        return self.state is InstanceState.SUSPECT and self.suspect_origin == LOST_NODE_ORIGIN

    @property
    def left_jobs(self) -> list[tuple[str, int]]:
        """(job, attempt) of the jobs that left before this check's verdict."""
        found = []
        for entry in sorted(self.hc_left):
            job_id, _, attempt = entry.rpartition("#")
            if job_id and attempt.isdigit():
                found.append((job_id, int(attempt)))
        return found

    @property
    def check_owner(self) -> str:
        """The job whose share of health checks this check takes: a waiting job, else one
        that left before the verdict (the check is still needed)."""
        if self.hc_jobs:
            return min(self.hc_jobs)
        return min((job_id for job_id, _ in self.left_jobs), default="")

    @property
    def cordoned(self) -> bool:
        return bool(self.cordon)

    @property
    def fenced(self) -> bool:
        """A rank's stop with fault evidence left it a suspect its check has not cleared."""
        return bool(self.suspect_fence)

    @property
    def placeable(self) -> bool:
        """What the stack's own placements ask of its item: AVAILABLE, not cordoned, no
        suspect fence (ECS's view of the node is asked separately)."""
        return self.state is InstanceState.AVAILABLE and not self.cordon and not self.suspect_fence

    @property
    def is_managed_instance(self) -> bool:
        """ECS Anywhere nodes are SSM managed instances (``mi-...``)."""
        return self.ec2_instance_id.startswith("mi-")
