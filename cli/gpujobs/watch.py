"""``gpujobs watch``: follow a job's state until it ends, one line per change (pipes) or
a live line redrawn in place (TTY), with the reasons of each transition."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TextIO

from cli.gpujobs import clock
from cli.gpujobs.client import ApiClient
from cli.gpujobs.constants import (
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_SERVER,
    EXIT_WATCH_TIMEOUT,
    FAILED_TERMINAL_STATES,
    PROG,
    TERMINAL_STATES,
)
from cli.gpujobs.errors import ApiError
from cli.gpujobs.render import (
    cell,
    fmt_duration,
    fmt_time,
    json_mode,
    parse_time,
    rank_counts,
    state_label,
    stdout,
)

WATCH_POLL_SECONDS = 5.0
WATCH_MAX_CONSECUTIVE_ERRORS = 5
WATCH_FIRST_REASONS = 5  # transitions shown when watching begins (then every new one)

# Green: working; red: a fault; magenta: stopped by a user; cyan/blue: paused by time sharing
# (not a failure: the job comes back); yellow (the default): waiting or being recovered.
_COLORS = {
    "COMPLETE": "32", "RUNNING": "32", "FAILED": "31", "NODE_LOST": "31", "HUNG": "31",
    "USER_STOPPED": "35", "CANCELED": "35", "CANCELING": "35", "SUSPENDING": "36", "SUSPENDED": "34",
}


def colored(state: str, enabled: bool) -> str:
    if not enabled:
        return state
    color = _COLORS.get(state.split(" ", 1)[0], "33")  # "SUSPENDED (held)" is colored as SUSPENDED
    return f"\x1b[1;{color}m{state}\x1b[0m"


class Watcher:
    """Renders job snapshots: one line per change (pipes) or a live line redrawn in place (TTY)."""

    SPINNER = "|/-\\"

    def __init__(self, stream: TextIO, tty: bool, started: float,
                 now: Callable[[], datetime] | None = None) -> None:
        self.stream = stream
        self.tty = tty
        self.color = tty and not os.environ.get("NO_COLOR")
        self.started = started
        self.now = now or clock.utcnow  # the API's clock: job times are on it
        self.last_key: tuple[Any, ...] | None = None
        self.last_label: str | None = None
        self.frame = 0
        self.live_shown = False
        self.finished = False

    def _elapsed(self, job: Mapping[str, Any]) -> str:
        """Since submission (or since watching began); frozen at ``updated_at`` once terminal."""
        submitted = parse_time(job.get("submitted_at"))
        if submitted is None:
            return fmt_duration(clock.monotonic() - self.started)
        end = self.now()
        if str(job.get("state", "")).upper() in TERMINAL_STATES:
            end = parse_time(job.get("updated_at")) or end
        return fmt_duration((end - submitted).total_seconds())

    def _change_line(self, job: Mapping[str, Any], previous: str | None) -> str:
        state = str(job.get("state", "?"))
        running, total, _ = rank_counts(job)
        shown = colored(state_label(job), self.color)
        transition = f"{previous} -> {shown}" if previous else shown
        parts = [fmt_time(self.now().isoformat()), str(job.get("job_id", "")), transition,
                 f"attempt={job.get('attempt', '-')}", f"ranks={running}/{total}",
                 f"elapsed={self._elapsed(job)}"]
        if state in FAILED_TERMINAL_STATES and job.get("last_error"):
            parts.append(f"error={cell(job.get('last_error'))}")
        suspend = job.get("suspend") if isinstance(job.get("suspend"), dict) else {}
        if state in ("SUSPENDING", "SUSPENDED") and suspend:
            parts.append(f"suspend={suspend.get('kind', '?')}")
            avoid = suspend.get("avoid") if isinstance(suspend.get("avoid"), dict) else {}
            if avoid:  # a move off a node with a driver warning
                parts.append(f"warning={avoid.get('action', '?')}:{avoid.get('confidence', '?')}")
            if suspend.get("by_job"):
                parts.append(f"by={suspend['by_job']}")
            if state == "SUSPENDING" and suspend.get("deadline_at"):
                parts.append(f"deadline={fmt_time(suspend.get('deadline_at'))}")
        return "  ".join(parts)

    def _live_line(self, job: Mapping[str, Any]) -> str:
        state = str(job.get("state", "?"))
        running, total, counted = rank_counts(job)
        width = 20
        filled = round(width * running / total) if total else 0
        bar = "#" * filled + "." * (width - filled)
        spin = self.SPINNER[self.frame % len(self.SPINNER)] if state not in TERMINAL_STATES else " "
        self.frame += 1
        line = (f"{spin} {job.get('job_id', '')}  {colored(state_label(job), self.color)}  "
                f"attempt {job.get('attempt', '-')}  ranks [{bar}] {running}/{total} {counted}  "
                f"elapsed {self._elapsed(job)}")
        waiting = str(job.get("wait_reason") or "")
        if waiting:  # why a queued (or suspended, queued again) job does not start yet
            line += f"  waiting: {waiting[:60] + '...' if len(waiting) > 63 else waiting}"
        return line

    @staticmethod
    def key(job: Mapping[str, Any]) -> tuple[Any, ...]:
        # held is part of the key: resuming a held job leaves it SUSPENDED, but queued again.
        return job.get("state"), job.get("attempt"), bool(job.get("held"))

    def changed(self, job: Mapping[str, Any]) -> bool:
        return self.key(job) != self.last_key

    def update(self, job: Mapping[str, Any], reasons: list[str] | None = None) -> None:
        """Show ``job``; on a change, its line and then ``reasons`` (the transitions since
        the last change, each with why it happened)."""
        key = self.key(job)
        changed = key != self.last_key
        previous = self.last_label
        self.last_key = key
        self.last_label = state_label(job)
        why = "".join(f"    {reason}\n" for reason in reasons or ()) if changed else ""
        if not self.tty:
            if changed:
                print(self._change_line(job, previous) + "\n" + why, end="", file=self.stream, flush=True)
            return
        out = "\r\x1b[2K"  # back to column 0, clear the live line
        if changed:
            out += self._change_line(job, previous) + "\n" + why
        out += self._live_line(job)
        self.stream.write(out)
        self.stream.flush()
        self.live_shown = True

    def warn(self, message: str) -> None:
        if self.tty and self.live_shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self.live_shown = False
        print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)

    def start(self) -> None:
        if self.tty:
            self.stream.write("\x1b[?25l")  # hide the cursor while redrawing

    def finish(self) -> None:
        """End the live line and show the cursor again (once: a timeout ends it early)."""
        if self.tty and not self.finished:
            self.stream.write(("\n" if self.live_shown else "") + "\x1b[?25h")
            self.stream.flush()
        self.finished = True


class Reasons:
    """The job's transitions not shown yet, as ``HH:MM:SS STATE: reason`` (the events
    route): what happened between two polls (a health check, a reboot, a restart)."""

    def __init__(self, client: ApiClient, job_id: str) -> None:
        self.client = client
        self.job_id = job_id
        self.shown: int | None = None

    def new(self) -> list[str]:
        try:
            events = [e for e in self.client.events(self.job_id).get("events") or [] if isinstance(e, dict)]
        except ApiError:  # only an aid: the state line says what matters
            return []
        start = max(0, len(events) - WATCH_FIRST_REASONS) if self.shown is None else self.shown
        self.shown = len(events)
        out = []
        for event in events[start:]:
            at = parse_time(event.get("at"))
            stamp = at.strftime("%H:%M:%S") if at else "--:--:--"
            out.append(f"{stamp} {event.get('to', '?')}: {cell(event.get('reason'))}")
        return out


def cmd_watch(client: ApiClient, args: argparse.Namespace) -> int:
    stream = stdout()
    tty = bool(getattr(stream, "isatty", lambda: False)()) and not json_mode(args)
    started = clock.monotonic()
    watcher = Watcher(stream, tty, started, now=client.server_now)
    errors = 0
    reasons = Reasons(client, args.job_id)
    watcher.start()
    try:
        while True:
            try:
                job = client.get_job(args.job_id)
                errors = 0
            except ApiError as exc:
                if exc.exit_code != EXIT_SERVER:
                    raise
                errors += 1
                if errors >= WATCH_MAX_CONSECUTIVE_ERRORS:
                    raise
                watcher.warn(f"{exc.message} (will keep trying)")
                clock.sleep(args.interval)
                continue
            if json_mode(args):
                key = (job.get("state"), job.get("attempt"), bool(job.get("held")))
                if key != watcher.last_key:
                    print(json.dumps(job, separators=(",", ":"), default=str), file=stream, flush=True)
                    watcher.last_key = key
            else:
                watcher.update(job, reasons.new() if watcher.changed(job) else None)
            state = str(job.get("state", "")).upper()
            if args.until and state == args.until:
                return EXIT_OK  # the state waited for (before the job ends: scripts go on from it)
            if state in TERMINAL_STATES:
                return EXIT_OK if state == "COMPLETE" else EXIT_JOB_FAILED
            if args.watch_timeout is not None and clock.monotonic() - started >= args.watch_timeout:
                watcher.finish()
                print(f"{PROG}: watch: {args.job_id} is still {state or '?'} after {args.watch_timeout:g} s "
                      "(--timeout); it goes on without being watched", file=sys.stderr)
                return EXIT_WATCH_TIMEOUT
            clock.sleep(args.interval)
    finally:
        watcher.finish()
