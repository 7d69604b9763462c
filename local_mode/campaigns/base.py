"""What every crash campaign shares: the invariant watched after every event, the e-mails
sent, the positions to break, and a campaign run from a flow's unbroken run.

A *flow* is a module-level function ``run(fault) -> result`` (``fault``: ``(n, mode)``, the
n-th AWS call the handlers make once the flow is armed, broken as a throttle or a lost
response; None: unbroken) whose result has ``fault``, ``fired``, ``calls`` and
``problems()`` (everything that ended wrong, the invariant included). ``campaigns.FLOWS``
names them; ``local_mode.faults.broken_runs`` forks a flow's broken runs from its unbroken
run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpu_recovery import constants as C
from gpu_recovery.repository import Repository

from ..emulator import LocalAws
from ..faults import FAULT_MODES, ApiCall
from ..invariants import forgotten_jobs
from ..sim.bus import Delivery, LocalEventBus

MIN = 60
#: the campaigns' DynamoDB (``LocalAws(dynamodb=...)``): the in-memory store, a run's calls and
#: outcome the same as on moto (tests/crash_consistency/test_fault_injection.py compares them)
DYNAMODB = "memory"


class FlowResult(Protocol):
    fault: tuple[int, str] | None
    fired: ApiCall | None
    calls: list[ApiCall]

    def problems(self) -> list[str]: ...


class InvariantWatch:
    """The backstop invariant (docs/recovery-loop.md), checked after every event the bus
    delivers: every job of ``job_ids`` that is neither RUNNING nor terminal has something
    due in the deadline index (or, queue-owned, is in the queue index). Reads through the
    emulator's own client: not the flow's calls, never broken."""

    def __init__(self, bus: LocalEventBus, repo: Repository, clock: Callable[[], float],
                 job_ids: Iterable[str] = ()) -> None:
        self.repo = repo
        self.clock = clock
        self.job_ids = set(job_ids)
        self.broken: list[str] = []
        self.checks = 0
        bus.observers.append(self._after)

    def watch(self, job_id: str) -> None:
        self.job_ids.add(job_id)

    def _after(self, delivery: Delivery) -> None:
        if not self.job_ids:
            return
        self.checks += 1
        now = self.clock()
        for job_id, why in sorted(forgotten_jobs(self.repo, now, job_ids=self.job_ids).items()):
            note = f"{job_id}: {why} (after {delivery.target} at t+{now % 86400:.0f})"
            if not any(b.startswith(f"{job_id}: {why}") for b in self.broken):
                self.broken.append(note)


def mails(local: LocalAws) -> list[tuple[str, str]]:
    """(event_kind, job id or '-') of every e-mail sent so far."""
    return [(str(n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE)), str(n["attributes"].get("job_id", "-")))
            for n in local.notifications()]


def mail_problems(sent: Sequence[tuple[str, str]], want: dict[tuple[str, str], tuple[int, int]]) -> list[str]:
    """``want``: (kind, job) -> (at least, at most) e-mails of that kind about that job. An
    e-mail is at least once: published, then its confirmation lost, it is sent again."""
    problems = []
    for (kind, job), (low, high) in want.items():
        count = sum(1 for s in sent if s == (kind, job))
        if not low <= count <= high:
            problems.append(f"{count} '{kind}' e-mail(s) about {job} (want {low}..{high})")
    return problems


def sample_positions(calls: Sequence[ApiCall], *, sites: str = "", by: str = "site") -> list[int]:
    """The first call of each distinct call site (and API operation) of the flow: every
    place the loop talks to AWS is broken at least once (``sites``: only call sites whose
    name contains it). ``by="stage"``: the first call of each stage module and of each API
    operation (coarser: ``make test``'s quick tier)."""
    if by not in ("site", "stage"):
        raise ValueError(f"by must be 'site' or 'stage', not {by!r}")
    seen: set[tuple[str, ...]] = set()
    positions = []
    for call in calls:
        if sites not in call.site:
            continue
        if by == "site":
            keys: tuple[tuple[str, ...], ...] = ((call.site, call.service, call.operation),)
        else:
            keys = ((call.site.split(":")[0],), (call.service, call.operation))
        if any(key not in seen for key in keys):
            seen.update(keys)
            positions.append(call.index)
    return positions


@dataclass
class CampaignSummary:
    flow: str
    calls: int
    runs: int
    ended_right: int
    failures: list[tuple[tuple[int, str], ApiCall | None, list[str]]]

    def as_dict(self) -> dict[str, Any]:
        failures = [{"fault": list(f), "call": f"{c.service}.{c.operation} at {c.site}" if c else None,
                     "problems": p} for f, c, p in self.failures]
        return {"flow": self.flow, "calls": self.calls, "runs": self.runs, "ended_right": self.ended_right,
                "failures": failures}


def campaign(flow: str, run: Callable[[tuple[int, str] | None], Any], positions: Sequence[int] | None = None,
             modes: tuple[str, ...] = FAULT_MODES) -> CampaignSummary:
    """Break each position (default: every call of the unbroken run) in each mode, each run
    forked from the unbroken one at the call it breaks."""
    from ..faults import BrokenRunFailed, broken_runs

    baseline = run(None)
    problems = baseline.problems()
    if problems:
        raise AssertionError(f"{flow}: the unbroken run itself failed: {problems}")
    chosen = list(positions) if positions is not None else [c.index for c in baseline.calls]
    runs = broken_runs(run, [(n, m) for n in chosen for m in modes])
    failures = []
    for fault, result in sorted(runs.items()):
        if isinstance(result, BrokenRunFailed):
            failures.append((fault, None, [str(result)[-2000:]]))
            continue
        wrong = result.problems() + ([] if result.fired else ["the fault never fired"])
        if wrong:
            failures.append((fault, result.fired, wrong))
    return CampaignSummary(flow, len(baseline.calls), len(runs), len(runs) - len(failures), failures)
