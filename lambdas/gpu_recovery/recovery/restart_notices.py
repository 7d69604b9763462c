"""What a restart's e-mails say of the fault: what the recovery did, in a line, and the
evidence and decision of a fault's nodes (a few spelled out, the others counted, so an e-mail
stays small whatever the job's size)."""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

from gpu_recovery.domain.evidence import Evidence
from gpu_recovery.domain.models import Job
from gpu_recovery.domain.states import SuspectVerdict
from gpu_recovery.domain.validation import email_clause
from gpu_recovery.repository.faults import FaultRepository

# Suspect nodes whose evidence one e-mail spells out; the rest are counted.
MAX_FAULTS_IN_EMAIL = 5


class RestartSummary(NamedTuple):
    done: str  # what the recovery did, in a line
    validations: list[str]  # how each repaired node proved itself
    validated: list[dict[str, Any]]  # the validation records of those nodes (the goodput ledger's)


def restart_summary(faults: FaultRepository, job: Job) -> RestartSummary:
    """What the recovery did, in a line, and of it how each repaired node proved itself
    before the restart (or that validation after repair is off): the restart's history says
    that much (one read of the suspects for both)."""
    tally = job.tally
    done = []
    validations: list[str] = []
    validated: list[dict[str, Any]] = []
    # The fault's suspects (its total, final once every old rank ended, which every
    # restart waits for): each judged, or left before its verdict, by now. Not the verdicts
    # on the job item: the healthy ones are counted on the tally's shards.
    suspects = tally.total or 0
    if tally.attempt == job.attempt - 1 and suspects:
        shown = faults.suspects(job.job_id, tally.attempt, limit=MAX_FAULTS_IN_EMAIL)
        fast = sorted(s.node for s in shown if s.findings.get("source") == "fast path")
        left = sorted(s.node for s in shown if s.verdict is SuspectVerdict.LEFT)
        checked = sorted(s.node for s in shown if s.node not in fast and s.node not in left)
        more = suspects - len(shown)
        if checked:
            done.append(f"DCGM health check of {', '.join(checked)}")
        if fast:
            done.append(f"no DCGM diag for {', '.join(fast)} (definitive evidence)")
        if left:
            done.append(f"moved off {', '.join(left)} before its DCGM verdict (checked in the "
                        "background)")
        if more > 0:
            done.append(f"and {more} more suspect node(s) judged")
        rebooted = sorted(s.node for s in shown if s.verdict is SuspectVerdict.REBOOT  # a held reboot is
                          or (s.verdict is SuspectVerdict.BLOCKED and not job.relocated))  # done first
        if rebooted or tally.reboot:
            extra = tally.reboot - len(rebooted)
            more_reboots = f" and {extra} more" if extra > 0 else ""
            done.append(f"reboot of {', '.join(rebooted) or 'nodes'}{more_reboots}")
        if tally.fatal - tally.held > len(left):
            done.append(f"{tally.fatal - tally.held - len(left)} node(s) unusable")
        # How each repaired node proved itself before the restart (or that it did not have to).
        validations = [email_clause(s.node, s.validation) for s in shown
                       if s.validation.get("result") in ("passed", "off")]
        validated = [dict(s.validation) for s in shown if s.validation.get("result") == "passed"]
        done += validations
    if job.relocated:
        moves = faults.placement(job.job_id, job.attempt)
        shown_moves = ", ".join(f"{a} -> {m.get('node', '?')}" for a, m in sorted(moves.items())[:10])
        done.append(f"relocated the ranks of {len(moves)} node(s) ({shown_moves})")
    if not suspects and job.restart_reason:
        done.append(f"restart without node action ({job.restart_reason})")
    return RestartSummary("; ".join(done) or "gang restart", validations, validated)


def fault_lines(faults: FaultRepository, job: Job, attempt: int) -> list[str]:
    """The evidence and decision of the fault of ``attempt``: a few nodes spelled out,
    the others counted (an e-mail stays small whatever the job's size)."""
    lines: list[str] = []
    records: list[tuple[str, dict[str, Any]]] = []
    last = job.last_fault
    if last and int(last.get("attempt") or 0) == attempt:
        records.append((str(last.get("node", "")), last))
    suspects = faults.suspects(job.job_id, attempt, limit=MAX_FAULTS_IN_EMAIL)
    records += [(s.node, s.record) for s in suspects if s.record]
    for node, record in records[:MAX_FAULTS_IN_EMAIL]:
        if record.get("evidence"):
            # An older record may not parse: the decision line below still says what happened.
            with contextlib.suppress(KeyError, TypeError, ValueError):
                lines += Evidence.from_dict(record["evidence"]).render_lines()
        plan = record.get("plan") or {}
        decision = plan.get("decision") or {}
        if plan:
            lines.append(f"Decision for {node}: {plan.get('action', '?')} ({decision.get('reason', '')})")
    total = job.tally.total if job.tally.attempt == attempt else None
    if total is not None and total > MAX_FAULTS_IN_EMAIL:
        lines.append(f"... and {total - MAX_FAULTS_IN_EMAIL} more suspect node(s): "
                     f"`gpu-recovery-admin faults --job-id {job.job_id} --attempt {attempt}` "
                     "lists them all")
    return lines
