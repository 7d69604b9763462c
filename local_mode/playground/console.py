"""The playground's console: thread-safe whole lines, stdout without Powertools' EMF
lines, and the feed of what happened since the last look."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import threading
from datetime import UTC, datetime
from typing import Any, TextIO

from gpu_recovery import constants as C
from local_mode.server import ApiResponse
from local_mode.training_programs import TrainingPrograms

TERMINAL = ("COMPLETE", "FAILED", "CANCELED", "USER_STOPPED")


class Console:
    """Thread-safe lines on a stream; each line is written whole."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self.stream = stream
        self.quiet = quiet
        self._lock = threading.Lock()

    def print(self, *lines: str) -> None:
        if self.quiet:
            return
        stream = self.stream or sys.stdout
        with self._lock:
            for line in lines:
                stream.write(line + "\n")
            stream.flush()


class StdoutWithoutEmf(io.TextIOBase):
    """sys.stdout while the playground runs: Powertools prints EMF metric lines there
    (CloudWatch Logs in Lambda) even with metrics disabled; they are dropped, every other
    line passes (each thread's partial line is held until its newline)."""

    def __init__(self, target: TextIO) -> None:
        self.target = target
        self._partial = threading.local()

    def write(self, text: str) -> int:
        pending = getattr(self._partial, "text", "") + text
        *lines, rest = pending.split("\n")
        self._partial.text = rest
        for line in lines:
            if not line.startswith('{"_aws"'):
                self.target.write(line + "\n")
        if lines:
            self.target.flush()
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return self.target.isatty()



def hms(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M:%S")


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ConsoleFeed:
    """What the console shows next, in time order: the cluster's timeline, the node agents',
    the playground's own notes, every job's state changes, failed deliveries, dead letters,
    training programs' errors and the text of each e-mail (SNS). The driver asks for the
    lines under the world lock."""

    def __init__(self) -> None:
        self._history_shown: dict[str, int] = {}  # job id -> history entries printed
        self._watching: set[str] = set()  # jobs not ended (or not every entry printed)
        self._printed = {"timeline": 0, "agents": 0, "notifications": 0, "dead_letters": 0, "failures": 0}
        self._notes: list[tuple[float, str, str]] = []  # (time, node, text) of the playground itself
        self._activity: tuple[int, ...] = ()  # what changes when a job may have changed
        self._api_calls = 0  # changing jobs-API and control-API calls

    def note_at(self, at: float, node: str, text: str) -> None:
        self._notes.append((at, node, text))

    def track(self, job_id: str) -> None:
        """Show this job's state changes on the console (from its first)."""
        if job_id not in self._history_shown:
            self._history_shown[job_id] = 0
            self._watching.add(job_id)

    def api_called(self, method: str, path: str, headers: dict[str, str], response: ApiResponse,
                   sim_now: float) -> None:
        if method == "GET":
            return
        self._api_calls += 1
        user = next((v for k, v in headers.items() if k.lower() == "x-local-user"), "local")
        doc: Any = {}
        with contextlib.suppress(ValueError):
            doc = response.json()
        if method == "POST" and path == "/v1/jobs" and response.status == 201 and isinstance(doc, dict):
            self.track(str(doc.get("job_id")))
        detail = ""
        if response.status >= 400 and isinstance(doc, dict):
            detail = f": {doc.get('message') or doc.get('error') or ''}"
        self.note_at(sim_now, "api", f"{user}: {method} {path} -> {response.status}{detail}")

    def lines(self, sim: Any, agents: Any, bus: Any, programs: TrainingPrograms | None,
              local: Any) -> list[str]:
        """What happened since the last look, in time order (called by the driver)."""
        entries: list[tuple[float, int, str]] = []
        timeline = sim.timeline
        for seq, entry in enumerate(timeline[self._printed["timeline"]:]):
            if entry.kind != "schedule":
                entries.append((entry.time, seq, f"{hms(entry.time)}  {entry.text}"))
        self._printed["timeline"] = len(timeline)
        agent_lines = agents.timeline
        for at, node, text, _label in agent_lines[self._printed["agents"]:]:
            entries.append((at, 10**6, f"{hms(at)}  {node:<8}  {text}"))
        self._printed["agents"] = len(agent_lines)
        notes, self._notes = self._notes, []
        for at, node, text in notes:
            entries.append((at, 10**6, f"{hms(at)}  {node:<8}  {text}"))
        entries += self._job_changes(sim, agents, bus, programs)
        entries.sort(key=lambda e: (e[0], e[1]))
        lines = [text for _, _, text in entries]
        failures = bus.failures()
        for delivery in failures[self._printed["failures"]:]:
            lines.append(f"!! {delivery.target} failed on {delivery.detail_type} (attempt "
                         f"{delivery.attempt}): {(delivery.error or '')[:300]}")
        self._printed["failures"] = len(failures)
        for dead in bus.dead_letters[self._printed["dead_letters"]:]:
            lines.append(f"!! event for {dead.target} in its dead-letter queue: {dead.error}")
        self._printed["dead_letters"] = len(bus.dead_letters)
        if programs is not None and programs.errors:
            lines += [f"!! training program: {e}" for e in programs.errors]
            programs.errors.clear()
        notifications = local.notifications()
        for note in notifications[self._printed["notifications"]:]:
            lines += self._email(note)
        self._printed["notifications"] = len(notifications)
        return lines

    def _job_changes(self, sim: Any, agents: Any, bus: Any,
                     programs: TrainingPrograms | None) -> list[tuple[float, int, str]]:
        """New history entries of the jobs not ended. A job changes only when a handler
        ran: an event delivered, a node report, an API call (reading every job's item is
        not free in the emulator: only then)."""
        from handlers import jobs_api

        out: list[tuple[float, int, str]] = []
        if programs is not None:
            for program in programs.ranks.values():
                self.track(program.job_id)
        activity = (len(bus.deliveries), agents.results.accepted, len(sim.timeline),
                    len(self._history_shown), self._api_calls)
        if activity == self._activity:
            return out
        self._activity = activity
        for job_id in sorted(self._watching):
            shown = self._history_shown[job_id]
            try:
                doc = jobs_api.service().events(job_id)
            except Exception:  # not a queue job (or gone): nothing to show
                self._watching.discard(job_id)
                continue
            events = doc.get("events") or []
            for event in events[shown:]:
                at = float(event.get("at") or 0)
                out.append((at, 10**7, f"{hms(at)}  {'job':<8}  {job_id} -> {event.get('to')}: "
                                       f"{event.get('reason')}"))
            self._history_shown[job_id] = len(events)
            if doc.get("state") in TERMINAL and len(events) == shown:
                self._watching.discard(job_id)
        return out

    @staticmethod
    def _email(note: dict[str, Any]) -> list[str]:
        kind = note["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE, "?")
        message = note["message"]
        text = message if isinstance(message, str) else json.dumps(message, indent=2)
        rule = "-" * 78
        return [rule, f"E-mail to the operators (SNS, event_kind={kind})", f"Subject: {note['subject']}", "",
                *text.splitlines(), rule]
