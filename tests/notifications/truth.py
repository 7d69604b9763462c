"""Does an operator e-mail tell the truth? What it says was done is held to what the stack
did: the AWS calls the handlers made (recorded with their parameters through the emulator's
API hooks) and the state they left (the job, the instance and the breaker as the e-mail was
published, read in SNS Publish's before-call hook, and at the flow's end). Its "What to do"
may name only commands that exist (parsed as the CLIs parse them: tests/docs/names.py).

Every clause of "What was done" (the line split at ``;``) must be one this module knows how
to check (:data:`CLAIMS`): a clause no check recognises is itself a problem, so a new wording
cannot slip through unchecked. The "Done:" line of the details (the effects carried out)
and its "Not done:" line are checked the same way.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain.placement import UNAVAILABLE_ATTRIBUTE
from tests.docs.names import command_problems

# The calls that change something outside the tables (the effects an e-mail reports).
WATCHED = (("ecs", "StopTask"), ("ecs", "StartTask"), ("ecs", "RunTask"),
           ("ecs", "UpdateContainerInstancesState"), ("ecs", "PutAttributes"), ("ecs", "DeleteAttributes"),
           ("ec2", "RebootInstances"), ("ssm", "SendCommand"),
           ("auto-scaling", "TerminateInstanceInAutoScalingGroup"))
NODE_EFFECTS = ("RebootInstances", "SendCommand", "UpdateContainerInstancesState",
                "TerminateInstanceInAutoScalingGroup")


@dataclass
class Call:
    n: int  # order among the recorded calls and publishes
    service: str
    operation: str
    params: dict[str, Any]
    at: float


@dataclass
class Mail:
    n: int
    at: float
    kind: str
    subject: str
    body: str
    job: dict[str, Any]  # the job item as the e-mail was published ({} for a node's e-mail)
    instances: dict[str, dict[str, Any]]  # container instance id -> its item, then
    breaker: dict[str, Any]

    def field(self, label: str) -> str:
        match = re.search(rf"^{re.escape(label)}:\s*(.*)$", self.body, re.M)
        return match.group(1).strip() if match else ""

    @property
    def job_id(self) -> str:
        value = self.field("Job")
        return "" if value == "-" else value

    def detail(self, label: str) -> str:
        match = re.search(rf"^  {re.escape(label)}: (.*)$", self.body, re.M)
        return match.group(1).strip() if match else ""


@dataclass
class Record:
    """Installed on a world before its flow runs: the effects' calls and each e-mail."""

    world: Any
    calls: list[Call] = field(default_factory=list)
    mails: list[Mail] = field(default_factory=list)
    _n: int = 0

    def __post_init__(self) -> None:
        hooks = self.world.aws.hooks
        for service, operation in WATCHED:
            hooks.on_after_call(service, operation, self._called(service, operation))
        hooks.on_before_call("sns", "Publish", self._publishing)

    def _next(self) -> int:
        self._n += 1
        return self._n

    def _called(self, service: str, operation: str) -> Callable[..., None]:
        def record(params: dict[str, Any], status: int, parsed: dict[str, Any], context: Any) -> None:
            if status < 300:
                self.calls.append(Call(self._next(), service, operation, dict(params), self.world.ecs.now()))
        return record

    def _publishing(self, params: dict[str, Any], context: Any) -> None:
        repo = self.world.repo
        attributes = {k: v.get("StringValue") for k, v in (params.get("MessageAttributes") or {}).items()}
        body = str(params.get("Message", ""))
        job_id = attributes.get("job_id") or ""
        ids = set(re.findall(r"\b[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b", body))
        instances = {i: repo.instances.get_instance_item(i) or {} for i in ids}
        self.mails.append(Mail(
            self._next(), self.world.ecs.now(), str(attributes.get(C.NOTIFICATION_KIND_ATTRIBUTE)),
            str(params.get("Subject", "")), body,
            (repo.jobs.get_job_item(job_id) or {}) if job_id not in ("", "-") else {},
            {i: item for i, item in instances.items() if item}, dict(repo.breaker.read() or {})))
        return None

    # ------------------------------------------------------------------ queries
    def node_name(self, container_instance_id: str) -> str:
        return self.world.node_name(container_instance_id)

    def ec2_id(self, container_instance_id: str) -> str:
        return self.world.ecs.node(self.node_name(container_instance_id)).instance_id

    def effects_on(self, container_instance_id: str, *, after: int = 0, before: int = 10**9) -> list[Call]:
        """Reboots, drains and terminations of the node between two points of the record."""
        ec2 = self.ec2_id(container_instance_id)
        found = []
        for call in self.calls:
            if not after < call.n < before or call.operation not in NODE_EFFECTS:
                continue
            text = repr(call.params)
            if container_instance_id in text or (ec2 and ec2 in text):
                found.append(call)
        return found

    def reboots_of(self, container_instance_id: str) -> list[Call]:
        return [c for c in self.effects_on(container_instance_id)
                if c.operation in ("RebootInstances", "SendCommand")]

    def drains_of(self, container_instance_id: str) -> list[Call]:
        return [c for c in self.effects_on(container_instance_id)
                if c.operation == "UpdateContainerInstancesState" and c.params.get("status") == "DRAINING"]

    def tasks(self, job_id: str) -> list[Any]:
        """The sim's training tasks of a job (not health checks or resets)."""
        return [t for t in self.world.ecs.tasks.values()
                if t.tags.get(C.TAG_JOB_ID) == job_id and not t.health_check and not t.gpu_reset]

    def attempt_of(self, task: Any) -> int:
        return int(task.tags.get(C.TAG_ATTEMPT) or 1)

    def health_checks_on(self, container_instance_id: str) -> list[Any]:
        node = self.node_name(container_instance_id)
        return [t for t in self.world.ecs.tasks.values() if t.health_check and t.node == node]

    def final_job(self, job_id: str) -> dict[str, Any]:
        return self.world.repo.jobs.get_job_item(job_id) or {}

    def final_instance(self, container_instance_id: str) -> dict[str, Any]:
        return self.world.repo.instances.get_instance_item(container_instance_id) or {}


# ---------------------------------------------------------------------- the claims
Check = Callable[[Record, Mail, "re.Match[str]"], str | None]
NODE = r"([0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})"


def _failed(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    state = mail.job.get("job_state")
    return None if state == "FAILED" else f"the job was {state} when the e-mail said it was marked FAILED"


def _back_in_service(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    state = (mail.instances.get(m.group(1)) or {}).get("instance_state")
    return None if state == "AVAILABLE" else f"{m.group(1)} was {state}, not back in service"


def _drained(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    if not record.drains_of(m.group(1)):
        return f"no UpdateContainerInstancesState DRAINING of {m.group(1)}"
    return None


def _rebooted(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    nodes = [n.strip() for n in m.group(1).split(",") if re.fullmatch(NODE, n.strip())]
    missing = [n for n in nodes if not record.reboots_of(n)]
    return f"no reboot (RebootInstances / SSM) of {missing}" if missing else None


def _terminated(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    return None if any(c.operation == "TerminateInstanceInAutoScalingGroup" for c in record.calls) else \
        "no TerminateInstanceInAutoScalingGroup"


def _health_checked(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    missing = [n.strip() for n in m.group(1).split(",") if not record.health_checks_on(n.strip())]
    return f"no health-check task ran on {missing}" if missing else None


def _not_health_checked(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    ran = [n.strip() for n in m.group(1).split(",") if record.health_checks_on(n.strip())]
    return f"a health-check task ran on {ran}" if ran else None


def _restarted(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    ranks, attempt = int(m.group(1)), int(m.group(2))
    started = [t for t in record.tasks(mail.job_id) if record.attempt_of(t) == attempt]
    if len(started) < ranks:
        return f"{len(started)} task(s) of attempt {attempt} started, not {ranks}"
    return None


def _unusable(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    """That many nodes of the faulted attempt are not used by the next one."""
    attempt = int(mail.job.get("attempt") or 1)
    before = {t.node for t in record.tasks(mail.job_id) if record.attempt_of(t) == attempt - 1}
    after = {t.node for t in record.tasks(mail.job_id) if record.attempt_of(t) == attempt}
    if len(before - after) < int(m.group(1)):
        return (f"{m.group(1)} node(s) said unusable, but attempt {attempt} runs on {sorted(after)}, "
                f"attempt {attempt - 1} ran on {sorted(before)}")
    return None


def _relocated(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    attempt = int(mail.job.get("attempt") or 1)
    after = {t.node for t in record.tasks(mail.job_id) if record.attempt_of(t) == attempt}
    problems = []
    for old, new in re.findall(rf"{NODE} -> {NODE}", m.group(0)):
        if record.node_name(new) not in after or record.node_name(old) in after:
            problems.append(f"{old} -> {new} (attempt {attempt} runs on {sorted(after)})")
    return "not moved: " + ", ".join(problems) if problems else None


def _observe_nothing(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    effects = [c for c in record.calls if c.operation in NODE_EFFECTS]
    stops = [c for c in record.calls if c.operation == "StopTask"
             and any(c.params.get("task") == t.arn for t in record.tasks(mail.job_id))]
    if effects or stops:
        return f"observe mode said nothing was done, but: {[c.operation for c in effects + stops]}"
    return None


def _asked_to_stop(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    arns = {t.arn for t in record.tasks(mail.job_id)}
    return None if any(c.operation == "StopTask" and c.params.get("task") in arns for c in record.calls) \
        else "no StopTask for the job's tasks"


def _flagged_suspect(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    node = mail.field("Container instance")
    state = (mail.instances.get(node) or {}).get("instance_state")
    return None if state == m.group(1) else f"{node} was {state}, not {m.group(1)}"


def _quiet_for(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    node, window = mail.field("Container instance"), float(m.group(1))
    again = [o for o in record.mails if o.kind == mail.kind and o.n > mail.n and o.at < mail.at + window
             and o.field("Container instance") == node and o.job_id == mail.job_id]
    return f"{len(again)} more {mail.kind} e-mail(s) within {window:g} s" if again else None


def _breaker_holds(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    """No node action between the trip and the breaker's close (its e-mail, or a reset)."""
    closed = next((o.at for o in record.mails if o.kind == "breaker_closed" and o.n > mail.n), float("inf"))
    reset_at = float((record.world.repo.breaker.read() or {}).get("last_reset_at") or 0)
    until = min(closed, reset_at if reset_at >= mail.at else float("inf"))
    acted = [c for c in record.calls if c.n > mail.n and c.at < until and c.operation in NODE_EFFECTS
             and not (c.operation == "UpdateContainerInstancesState" and c.params.get("status") == "ACTIVE")]
    return f"node actions while it was tripped: {[c.operation for c in acted]}" if acted else None


def _in_backlog(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    node = mail.field("Container instance")
    backlog = {str(e.get("node")) for e in mail.breaker.get("backlog") or []}
    return None if node in backlog else f"{node} not in the breaker's backlog ({sorted(backlog)})"


def _cordoned(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    node = mail.field("Container instance")
    put = [c for c in record.calls if c.operation == "PutAttributes" and node in repr(c.params)
           and UNAVAILABLE_ATTRIBUTE in repr(c.params)]
    return None if put else f"no PutAttributes {UNAVAILABLE_ATTRIBUTE} on {node}"


def _held(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    state = mail.job.get("job_state")
    return None if state == "HELD" else f"the job was {state}, not HELD"


def _waits_until(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    from datetime import UTC, datetime

    deadline = mail.job.get("breaker_hold", {}).get("until") or mail.job.get(C.DEADLINE_SK)
    shown = datetime.fromtimestamp(float(deadline or 0), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return None if shown == m.group(1) else f"its deadline is {shown}, not {m.group(1)}"


def _breaker_closed(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    state = mail.breaker.get("state")
    return None if state == "closed" else f"the breaker was {state}"


def _backlog_carried_out(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    previous = next((o for o in reversed(record.mails) if o.n < mail.n and o.kind == "breaker_tripped"), None)
    nodes = {str(e.get("node")) for e in (previous.breaker.get("backlog") if previous else []) or []}
    missing = [n for n in nodes if not record.effects_on(n, after=mail.n)]
    return f"held-back actions never carried out on {missing}" if missing else None


def _stays_open(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    closed = [o for o in record.mails if o.n > mail.n and o.kind == "breaker_closed"]
    return "it closed by itself after all" if closed else None


def _backlog_size(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    size = len(mail.breaker.get("backlog") or [])
    return None if size == int(m.group(1)) else f"the backlog held {size}, not {m.group(1)}"


def _node_rebooted(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    node = mail.field("Container instance")
    return None if record.reboots_of(node) else f"no reboot (RebootInstances / SSM) of {node}"


def _node_drained(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    node = mail.field("Container instance")
    return None if record.drains_of(node) else f"no UpdateContainerInstancesState DRAINING of {node}"


def _waiting_jobs_restart(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    later = [t for t in record.world.ecs.tasks.values() if t.created_at > mail.at and not t.health_check
             and not t.gpu_reset and record.attempt_of(t) > 1]
    return None if later else "no job's ranks were started again after it"


def _hung(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    state = mail.job.get("job_state")
    return None if state == "HUNG" else f"the job was {state}, not HUNG"


def _nothing_stopped(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    arns = {t.arn for t in record.tasks(mail.job_id)}
    stopped = [c for c in record.calls if c.operation == "StopTask" and c.params.get("task") in arns]
    return f"{len(stopped)} StopTask call(s) for the job's tasks" if stopped else None


def _not_registered(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    job = record.world.repo.jobs.get_job(mail.job_id)
    ranks = [t for t in record.tasks(mail.job_id) if record.world.repo.registrations.look_up_task(t.arn).rank]
    return f"registered: job {job is not None}, {len(ranks)} rank(s)" if job or ranks else None


def _requeued(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    order = str(mail.job.get(C.QUEUE_SK) or "")
    state = mail.job.get("job_state")
    if state not in ("QUEUED", "PENDING_RESOURCES") or C.RELOCATED_QUEUE_MARK not in order:
        return f"the job was {state} with queue order {order!r}, not back at the head of its priority"
    return None


def _started_elsewhere(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    final = record.final_job(mail.job_id)
    attempt = int(mail.job.get("attempt") or 1)
    left = {record.node_name(n) for n in (mail.job.get("relocation") or {}).get("from_nodes") or []}
    nodes = {t.node for t in record.tasks(mail.job_id) if record.attempt_of(t) > attempt}
    if int(final.get("attempt") or 0) <= attempt or not nodes:
        return "the scheduler never started it again"
    if nodes & left:
        return f"started again on the node(s) it left: {sorted(nodes & left)}"
    return None


def _cordon_held(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    """Known bad (cordoned in the table) but no ECS attribute put while the limit is tripped."""
    node = mail.field("Container instance")
    if not (mail.instances.get(node) or {}).get("cordon"):
        return f"{node} was not cordoned in the table"
    reset_at = float((record.world.repo.breaker.read() or {}).get("last_reset_at") or 0)
    put = [c for c in record.calls if c.n > mail.n and c.operation == "PutAttributes"
           and node in repr(c.params) and UNAVAILABLE_ATTRIBUTE in repr(c.params)
           and not (reset_at >= mail.at and c.at >= reset_at)]
    return f"the ECS attribute was put on {node} while the limit was tripped" if put else None


def resets_of(record: Record, container_instance_id: str) -> list[Any]:
    node = record.node_name(container_instance_id)
    return [t for t in record.world.ecs.tasks.values() if t.gpu_reset and t.node == node]


def _reset(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    """A GPU reset task ran on the node (or, failed, it was rebooted)."""
    node = m.group(1) if m.groups() else mail.field("Container instance")
    return None if resets_of(record, node) or record.reboots_of(node) else f"no GPU reset task on {node}"


def _kept_out(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    """The node was cordoned in the table when the e-mail was sent (out of every placement)."""
    node = mail.field("Container instance")
    return None if (mail.instances.get(node) or {}).get("cordon") else f"{node} was not cordoned"


def _suspended_by_its_move(outcome: str) -> Check:
    """The job was suspended (every rank stopped) by its move, whose last record is ``outcome``
    (moved at its checkpoint, or stopped at its bound), not failed or restarted."""
    def check(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
        moves = [m.get("outcome") for m in mail.job.get("moves") or []]
        state = mail.job.get("job_state")
        if state != "SUSPENDED" or not moves or moves[-1] != outcome:
            return f"the job was {state} with moves {moves}, not suspended by its move ({outcome})"
        return _tasks_ended(record, mail)
    return check


def _held_by_owner(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    if mail.job.get("job_state") != "SUSPENDED" or mail.job.get("held") is not True \
            or C.QUEUE_PK in mail.job:
        state, held = mail.job.get("job_state"), mail.job.get("held")
        return f"the job was {state}, held={held}, not held out of the queue"
    return None


def _requeued_ahead_and_restarted(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    order = str(mail.job.get(C.QUEUE_SK) or "")
    if C.RELOCATED_QUEUE_MARK not in order:
        return f"queue order {order!r}: not at the head of its priority"
    return _new_attempt(record, mail)


def _cordoned_and_repaired(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    node = m.group(1)
    put = [c for c in record.calls if c.operation == "PutAttributes" and node in repr(c.params)
           and UNAVAILABLE_ATTRIBUTE in repr(c.params)]
    if not put:
        return f"no PutAttributes {UNAVAILABLE_ATTRIBUTE} on {node}"
    return _reset(record, mail, m) if m.group(2) == "reset_gpu" else (
        None if record.reboots_of(node) or record.drains_of(node) else f"{node} never repaired")
def _validated(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    """A validation task ran on the node (a repaired node's, recovery.validations) and passed."""
    node = record.node_name(m.group(1))
    passed = [t for t in record.world.ecs.tasks.values() if t.node == node and t.validation and t.done
              and t.exit_code == 0 and (t.stopped_at or 0) <= mail.at]
    return None if passed else f"no validation task passed on {node} before the e-mail"


def _not_validated(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    node = record.node_name(m.group(1))
    ran = [t for t in record.world.ecs.tasks.values() if t.node == node and t.validation]
    return f"{len(ran)} validation task(s) ran on {node}" if ran else None


def _notice_cordon(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    """AWS's notice (recovery.aws_notices): the node cordoned as ``aws-notice`` in the table when
    the e-mail was sent, and the attribute put with that value."""
    node = mail.field("Container instance")
    item = mail.instances.get(node) or {}
    if not (item.get("cordon") or {}).get("notice") or not item.get("notice"):
        return f"{node} carried no notice cordon: {item.get('cordon')}"
    put = [c for c in record.calls if c.operation == "PutAttributes" and node in repr(c.params)
           and "aws-notice" in repr(c.params)]
    return None if put else f"no PutAttributes {UNAVAILABLE_ATTRIBUTE}=aws-notice on {node}"


def _jobs_asked_to_move(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    """Each job named was asked to leave the node (a move, or a note that it stays, on its item)."""
    for job_id in [j.strip() for j in m.group(1).split(",")]:
        final = record.final_job(job_id)
        moves = [mv for mv in final.get("moves") or [] if str(mv.get("rule") or "").startswith("aws-notice")]
        if not moves and final.get("job_state") not in ("RUNNING", "RECOVERING", "FAILED", "COMPLETE"):
            return f"job {job_id} was never moved off the node ({final.get('job_state')})"
    return None


def _no_job_there(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    node = record.node_name(mail.field("Container instance"))
    live = [t.label for t in record.world.ecs.tasks.values() if t.node == node and t.created_at <= mail.at
            and not t.health_check and (t.stopped_at is None or t.stopped_at > mail.at)]
    return f"tasks ran on {node}: {live}" if live else None


def _stays_cordoned(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    node = mail.field("Container instance")
    item = record.world.repo.instances.get_instance_item(node) or {}
    return None if item.get("cordon") else f"{node} is not cordoned at the end"


def _drained_and_stays_cordoned(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    node = mail.field("Container instance")
    return (None if record.drains_of(node) else f"no UpdateContainerInstancesState DRAINING of {node}") \
        or _stays_cordoned(record, mail, m)


def _node_kept_out(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    node = m.group(1)
    item = mail.instances.get(node) or record.world.repo.instances.get_instance_item(node) or {}
    return None if item.get("cordon") else f"{node} was not cordoned"


def _moved_off_notice(record: Record, mail: Mail, m: re.Match[str]) -> str | None:
    """Every rank stopped: at its checkpoint (``moved``) or by the stop before the deadline."""
    want = "moved" if m.group(1) == "moved" else "stopped_at_deadline"
    moves = [mv.get("outcome") for mv in mail.job.get("moves") or []]
    state = mail.job.get("job_state")
    if state != "SUSPENDED" or not moves or moves[-1] != want:
        return f"the job was {state} with moves {moves}, not {want}"
    return _tasks_ended(record, mail)


def _descriptive(record: Record, mail: Mail, _m: re.Match[str]) -> str | None:
    """A clause that reports no effect (what the operator may expect): nothing to hold it to."""
    return None


CLAIMS: list[tuple[str, Check]] = [
    (r"its gang preflights pin no node until [\d.]+ h after the last cleared one "
     r"\(they conclude inconclusive and the job goes on\)", _descriptive),
    (r"Job marked FAILED( \(it was HELD, not charged\))?", _failed),
    (rf"{NODE} back in service", _back_in_service),
    (r"the jobs that waited for the check go on without spending a recovery", _descriptive),
    (rf"{NODE} drained \(DRAINING\) so nothing new is placed on it", _drained),
    (rf"{NODE} rebooted", _rebooted),
    (r"it returns to service when it is back", _descriptive),
    (rf"{NODE}'s GPUs reset \(rebooted instead if the reset fails\)", _reset),
    (r"it returns to service when it passes", _descriptive),
    (r"kept out of placement until then", _kept_out),
    (r"Rank 0 saved a checkpoint and stopped the job \d+ s after it was asked",
     _suspended_by_its_move("moved")),
    (r"the job is back in the queue ahead of every job of its priority and restarts on healthy nodes from "
     r"(that|its last) checkpoint", _requeued_ahead_and_restarted),
    (r"The job was stopped at the end of its move's bound \(its owner suspended it and rank 0 did not call "
     r"go_suspend\(\): it resumes from its last checkpoint\)", _suspended_by_its_move("stopped_at_deadline")),
    (r"the job is held by its owner until resumed \(gpujobs resume\)", _held_by_owner),
    (rf"{NODE} takes no new work and is repaired \((\w+)\)\. Avoided: .*", _cordoned_and_repaired),
    (r"reboot of ([^;]+?)(?: and \d+ more)?", _rebooted),
    (r"terminated in its Auto Scaling group.*", _terminated),
    (r"DCGM health check of ([^;]+)", _health_checked),
    (r"no DCGM diag for ([^;]+) \(definitive evidence\)", _not_health_checked),
    (r"all (\d+) ranks restarted as attempt (\d+)", _restarted),
    (r"(\d+) node\(s\) unusable", _unusable),
    (r"relocated the ranks of \d+ node\(s\) \(.*\)", _relocated),
    (r"Nothing \(observe mode\): no StopTask, health check, reboot, drain or termination", _observe_nothing),
    (r"the job is marked FAILED in the job table", _failed),
    (r"Nothing \(observe mode\): job marked FAILED in the job table only", _observe_nothing),
    (r"its tasks were asked to stop \(ECS stops the lost one once its agent reconnects\)", _asked_to_stop),
    (r"Node flagged (SUSPECT) \(was AVAILABLE\)", _flagged_suspect),
    (r"further signals of these kinds are not e-mailed for (\d+) s", _quiet_for),
    (r"No node is rebooted, replaced or quarantined automatically until .*", _breaker_holds),
    (r"every held-back action is kept in its backlog \(this one included\), and its node is cordoned: .*",
     lambda r, mail, m: _in_backlog(r, mail, m) or _cordoned(r, mail, m)),
    (rf"Job HELD on {NODE}, not failed \(its budget is not charged while held\)", _held),
    (r"its other nodes stay reserved for its restart", _descriptive),
    (r"it waits until (\S+) \(\d+ s, held_job_deadline_seconds\)", _waits_until),
    (r"Automatic reboots, replacements and quarantines are on again", _breaker_closed),
    (r"the held-back actions are carried out by the recovery sweep, a window's allowance at a time, and "
     r"jobs HELD for those nodes restart once their nodes are back", _backlog_carried_out),
    (r"It will not close by itself", _stays_open),
    (rf"{NODE} and every known-bad node after it stay out of the queue scheduler's placements and of "
     rf"relocation, but do NOT get the ECS attribute {re.escape(UNAVAILABLE_ATTRIBUTE)}: ECS may place "
     r"tag-registered tasks on them until the breaker is reset", _cordon_held),
    (r"The node is rebooted instead \(the usual reboot flow\)", _node_rebooted),
    (r"the jobs waiting for it restart once it is back", _waiting_jobs_restart),
    (r"instance drained \(DRAINING\)", _node_drained),
    (r"Job marked HUNG", _hung),
    (r"nothing was stopped", _nothing_stopped),
    (r"Nothing: its ranks are not registered, a GPU fault in this job is not recovered", _not_registered),
    (r"Job back in the queue ahead of every job of its priority \(original queue position kept\)", _requeued),
    (r"the scheduler starts every rank again on healthy nodes \(MASTER_ADDR: rank 0's node\)",
     _started_elsewhere),
    (r"(\d+) held-back action\(s\) stay in its backlog and jobs HELD for them wait until their deadline",
     _backlog_size),
    (r"validated (\S+) after its (?:reboot|GPU reset) \(DCGM level \d(?: \+ \d+ s GPU load)?\): passed in "
     r"[\d.]+ s", _validated),
    (r"(\S+) not validated after its (?:reboot|GPU reset) \(validate_after_repair is false\)",
     _not_validated),
    # AWS's notices (recovery.aws_notices)
    (rf"The node: it takes no new work from now \(placement attribute {re.escape(UNAVAILABLE_ATTRIBUTE)}="
     r"aws-notice\) and is never chosen as a spare or relocation target", _notice_cordon),
    (r"The node: it was cordoned already and stays so", _kept_out),
    (r"its job\(s\) (.+?) are asked to checkpoint and move \(.*\)", _jobs_asked_to_move),
    (r"no job runs on it", _no_job_there),
    (r"it stays cordoned: AWS takes the instance", _stays_cordoned),
    (r"it is drained in ECS \(DRAINING: no scheduler places on it\) and stays cordoned: AWS takes the "
     r"instance", _drained_and_stays_cordoned),
    (r"it returns to service after the window", _descriptive),
    (r"The job was (moved|stopped) (?:at its checkpoint \(\d+ s after it was asked\)|before AWS takes the "
     r"node \(.*\))", _moved_off_notice),
    (r"it is back in the queue ahead of every job of its priority and restarts on other nodes when capacity "
     r"exists", _requeued_ahead_and_restarted),
    (rf"{NODE} takes no new work", _node_kept_out),
    (r"The job keeps running \(.*\)", _nothing_stopped),
    (r"when AWS takes the node, the job's ranks there end and the recovery restarts it from its last "
     r"checkpoint on other nodes", _descriptive),
]

EFFECT_CHECKS: dict[str, Callable[[Record, Mail], str | None]] = {
    "stop_tasks": lambda r, mail: _tasks_ended(r, mail),
    "restart_job": lambda r, mail: _new_attempt(r, mail),
    "drain": lambda r, mail: None if r.drains_of(mail.field("Container instance")) else "no drain of it",
    "reboot": lambda r, mail: None if r.reboots_of(mail.field("Container instance")) else "no reboot of it",
    "reset_gpu": lambda r, mail: _reset(r, mail, re.match("", "")),  # type: ignore[arg-type]
    "terminate": lambda r, mail: _terminated(r, mail, re.match("", "")),  # type: ignore[arg-type]
}


def _tasks_ended(record: Record, mail: Mail) -> str | None:
    """The tasks the decision stopped: the job's of its attempts so far (a node's e-mail: the
    ones on the node), stopped by the end of the flow."""
    if mail.job_id:
        attempt = int(mail.job.get("attempt") or 1)
        tasks = [t for t in record.tasks(mail.job_id) if record.attempt_of(t) <= attempt]
    else:
        node = record.node_name(mail.field("Container instance"))
        tasks = [t for t in record.world.ecs.tasks.values() if t.node == node and t.created_at <= mail.at
                 and not t.health_check and not t.gpu_reset]
    live = [t.label for t in tasks if not t.done]
    return f"tasks still running: {live}" if live else None


def _new_attempt(record: Record, mail: Mail) -> str | None:
    attempt = int(mail.job.get("attempt") or 1)
    later = [t for t in record.tasks(mail.job_id) if record.attempt_of(t) > attempt]
    final = int(record.final_job(mail.job_id).get("attempt") or 1)
    return None if later or final > attempt else "no later attempt was started"


def problems(record: Record, mail: Mail) -> list[str]:
    """What ``mail`` says that the record does not bear out."""
    found: list[str] = []
    for clause in clauses(mail.field("What was done")):
        for pattern, check in CLAIMS:
            match = re.fullmatch(pattern, clause)
            if match:
                problem = check(record, mail, match)
                if problem:
                    found.append(f"'{clause}': {problem}")
                break
        else:
            found.append(f"'{clause}': no check knows this claim (tests/notifications/truth.py CLAIMS)")
    for effect in [e.strip() for e in mail.detail("Done").split(",") if e.strip()]:
        check = EFFECT_CHECKS.get(effect)
        problem = check(record, mail) if check else "an effect no check knows"
        if problem:
            found.append(f"Done: {effect}: {problem}")
    not_done = mail.detail("Not done")
    if not_done.startswith("restart_job") and _new_attempt(record, mail) is None:
        found.append("Not done: restart_job: a later attempt was started")
    found += [f"What to do: {p}" for p in command_mentions_problems(mail.field("What to do"))]
    return found


def clauses(text: str) -> list[str]:
    """The sentence's clauses: split at ``;`` outside parentheses."""
    found, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == ";" and depth == 0:
            found.append(current.strip())
            current = ""
        else:
            current += char
    return [c for c in [*found, current.strip()] if c]


COMMAND = re.compile(r"`((?:gpujobs|gpu-recovery-admin) [^`]*)`"
                     r"|\b((?:gpujobs|gpu-recovery-admin) [a-z][\w -]*)")


def command_mentions_problems(text: str) -> list[str]:
    """Every command the text names (quoted or not) parses as its program parses it."""
    found = []
    for quoted, plain in COMMAND.findall(text):
        command = (quoted or plain).strip()
        try:
            words = shlex.split(command)
        except ValueError as error:
            found.append(f"`{command}`: {error}")
            continue
        found += command_problems(words, partial=True)
    return found
