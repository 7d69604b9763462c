"""Operator notifications: readable subject and body, plus a filterable kind."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum


class NotificationKind(str, Enum):
    """SNS message attribute ``event_kind``: operators filter subscriptions on it."""

    RECOVERED = "recovered"
    FAILED = "failed"
    QUARANTINED = "quarantined"
    APPLICATION_ERROR = "application_error"
    REBOOT_TIMEOUT = "reboot_timeout"
    HEALTH_CHECK_TIMEOUT = "health_check_timeout"
    NODE_LOST = "node_lost"
    HUNG = "hung"
    SUSPECT_NODE = "suspect_node"
    OPERATOR_ACTION = "operator_action"  # a configuration problem, or a node needing a person
    OBSERVED = "observed"  # observe mode: what would have been done
    BREAKER_TRIPPED = "breaker_tripped"
    # The tripped breaker closed by itself: the nodes it acted on are back healthy.
    BREAKER_CLOSED = "breaker_closed"
    # The tripped breaker will not close by itself (a node it acted on failed again or did
    # not come back): it stays open until an operator resets it.
    BREAKER_NEEDS_OPERATOR = "breaker_needs_operator"
    # Even the cordon limit tripped: known-bad nodes stay out of the queue's placements but
    # ECS may place tag-registered tasks on them until the breaker is reset.
    CORDON_LIMIT_TRIPPED = "cordon_limit_tripped"
    RELOCATED = "relocated"
    # A job that cannot move waits (HELD) for a node whose reboot the breaker held back.
    JOB_HELD = "job_held"
    JOB_REFUSED = "job_refused"  # a tagged job larger than the supported size: not protected
    # A node's GPU reset failed (or its task was lost / timed out): rebooted instead.
    GPU_RESET_FAILED = "gpu_reset_failed"
    # The driver warned about a GPU (its recovery action, a pending remap, a counter rising):
    # an idle node repaired at once, a job moved at its checkpoint, or one that keeps running.
    GPU_WARNING = "gpu_warning"
    # A repaired node failed its validation under load: repaired again, replaced or quarantined.
    VALIDATION_FAILED = "validation_failed"
    # A job's or a user's own evidence (its preflight, its exit codes) named nodes the stack's
    # check then cleared, too often: its evidence no longer moves nodes (issue 49).
    TENANT_EVIDENCE_LIMITED = "tenant_evidence_limited"
    # AWS announced that capacity goes away (a Capacity Block's end, a Spot or reservation
    # interruption, scheduled maintenance): the nodes, the jobs moved off them, when, what was done.
    CAPACITY_NOTICE = "capacity_notice"


@dataclass(frozen=True)
class Notification:
    kind: NotificationKind
    subject: str
    body: str
    job_id: str = ""
    attributes: dict[str, str] = field(default_factory=dict)

    def digest(self) -> str:
        """Names this message (the same notice owed twice is one outbox item)."""
        text = "\x1f".join((self.kind.value, self.subject, self.body))
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def published_body(self) -> str:
        """The body as e-mailed, its notice id last: a notice is published at least once (a
        ``Publish`` whose answer was lost is sent again), and a repeat carries the same id."""
        return f"{self.body}\nNotice {self.digest()} (an e-mail with this id is a repeat of this one)\n"


@dataclass(frozen=True)
class NotificationFacts:
    job_id: str
    ranks: Iterable[int] = ()
    container_inst_id: str = ""
    instance_id: str = ""  # EC2 i-... or managed mi-...
    what_happened: str = ""
    what_was_done: str = ""
    # Infrastructure recoveries used / allowed; None when not known (a node-level message):
    # the line is then left out rather than reading "0 of 0".
    attempt: int = 0
    max_attempts: int | None = None
    operator_action: str = ""
    details: Iterable[str] = ()  # e.g. Evidence.render_lines() + RemediationPlan.render_lines()


_SUBJECT_PREFIX = "[GPU recovery]"
#: SNS Publish: a Subject is less than 100 characters of printable ASCII, no line breaks or
#: control characters (SNS API Reference, Publish; the body carries the whole text)
MAX_SUBJECT_CHARS = 99


def email_subject(text: str) -> str:
    """``text`` as an SNS Subject: printable ASCII (other characters as "?", whitespace as
    one space), cut to 99 characters with "..." when longer."""
    printable = "".join(c if " " <= c <= "~" else (" " if c.isspace() else "?") for c in text)
    subject = " ".join(printable.split())
    if len(subject) > MAX_SUBJECT_CHARS:
        subject = subject[:MAX_SUBJECT_CHARS - 3].rstrip() + "..."
    return subject


def build(kind: NotificationKind, headline: str, facts: NotificationFacts) -> Notification:
    # A node-level message has no job.
    about = f"job {facts.job_id}" if facts.job_id else f"node {facts.container_inst_id or '-'}"
    subject = email_subject(f"{_SUBJECT_PREFIX} {headline}: {about}")
    ranks = ", ".join(str(r) for r in sorted(facts.ranks))
    lines = [
        headline,
        "",
        f"Job:                {facts.job_id or '-'}",
        *([f"Ranks:              {ranks}"] if ranks else []),
        f"Container instance: {facts.container_inst_id or '-'}",
        f"Instance:           {facts.instance_id or '-'}",
        f"What happened:      {facts.what_happened}",
        f"What was done:      {facts.what_was_done}",
        *([f"Recovery attempt:   {facts.attempt} of {facts.max_attempts}"]
          if facts.max_attempts is not None else []),
        "",
        f"What to do: {facts.operator_action}",
    ]
    details = list(facts.details)
    if details:
        lines += ["", "Details:", *(f"  {line}" for line in details)]
    return Notification(
        kind=kind,
        subject=subject,
        body="\n".join(lines) + "\n",
        job_id=facts.job_id,
        attributes={"job_id": facts.job_id or "-", "instance_id": facts.instance_id or "-"},
    )
