"""The subcommands but ``watch``: submit, list, show, cancel, suspend, resume, quota,
events, logs. Each takes the client and the parsed arguments and returns the exit code."""

from __future__ import annotations

import argparse
import json
import select
import sys
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from cli.gpujobs import clock
from cli.gpujobs.client import ApiClient
from cli.gpujobs.constants import EXIT_OK, PROG, TERMINAL_STATES
from cli.gpujobs.errors import ApiError, CliError
from cli.gpujobs.goodput import ledger_lines
from cli.gpujobs.render import fmt_time, format_job, json_mode, nodes_label, print_json, stdout, table
from cli.gpujobs.spec import build_spec, check_as_the_api_would

LOGS_POLL_SECONDS = 2.0
# The API's 404s of a log that is not there yet (the job not started, its stream not written).
NOT_YET = ("has not started yet", "(yet)")
MAX_PAGES = 10_000  # guard against a server that never stops paginating


def cmd_submit(client: ApiClient, args: argparse.Namespace) -> int:
    spec = build_spec(args)
    if args.dry_run:
        check_as_the_api_would(spec)
        print_json(spec)
        return EXIT_OK
    job = client.submit(spec, args.idempotency_key or str(uuid.uuid4()))
    if json_mode(args):
        print_json(job)
    else:
        print(job.get("job_id", ""), file=stdout())
    return EXIT_OK


def _iter_job_pages(client: ApiClient, args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    token = args.next_token
    seen: set[str] = set()
    for _ in range(MAX_PAGES):
        page = client.list_jobs(state=args.state.upper() if args.state else None, user=args.user,
                                limit=args.limit, next_token=token)
        yield page
        token = page.get("next_token")
        if not args.all or not token or token in seen:
            return
        seen.add(token)


def cmd_list(client: ApiClient, args: argparse.Namespace) -> int:
    jobs: list[dict[str, Any]] = []
    next_token = None
    for page in _iter_job_pages(client, args):
        jobs += [j for j in page.get("jobs") or [] if isinstance(j, dict)]
        next_token = page.get("next_token")
    if json_mode(args):
        print_json({"jobs": jobs, "next_token": next_token})
        return EXIT_OK
    if not jobs:
        print("no jobs", file=sys.stderr)
    else:
        rows = [[j.get("job_id"), j.get("name"), j.get("state"), j.get("user"),
                 j.get("priority_name") or j.get("priority"),
                 nodes_label(j), j.get("attempt"), fmt_time(j.get("submitted_at")) or None] for j in jobs]
        for line in table(["JOB ID", "NAME", "STATE", "USER", "PRIORITY", "NODES", "ATTEMPT", "SUBMITTED"],
                           rows):
            print(line, file=stdout())
    if next_token and not args.all:
        print(f"(more jobs: --next-token {next_token} or --all)", file=sys.stderr)
    return EXIT_OK


def cmd_show(client: ApiClient, args: argparse.Namespace) -> int:
    job = client.get_job(args.job_id, ranks_from=args.ranks_from, ranks_limit=args.ranks_limit)
    if json_mode(args):
        print_json(job)
    else:
        ledger = job.get("goodput")
        lines = format_job(job) + (ledger_lines(ledger) if isinstance(ledger, Mapping) else [])
        print("\n".join(lines), file=stdout())
    return EXIT_OK


def cmd_cancel(client: ApiClient, args: argparse.Namespace) -> int:
    """Cancel; a job that had already ended otherwise (COMPLETE, FAILED...) is an error: nothing
    was canceled (a repeat on a canceled job is not: it already was)."""
    result = client.cancel(args.job_id)
    job_id = str(result.get("job_id") or args.job_id)
    state = str(result.get("state") or "CANCELING")
    ended_otherwise = result.get("changed") is False and state in TERMINAL_STATES and state != "CANCELED"
    if json_mode(args):
        print_json(result)
    elif not ended_otherwise:
        again = " (it already was)" if result.get("changed") is False else ""
        print(f"{job_id}: {state}{again}", file=stdout())
    if ended_otherwise:
        raise CliError(f"{job_id} already ended {state}: nothing to cancel")
    return EXIT_OK


def _suspend_outcome(result: Mapping[str, Any], job_id: str, action: str) -> str:
    """One line, ``ID: STATE`` first (like ``cancel``), then what happens next."""
    job_id = str(result.get("job_id") or job_id)
    state = str(result.get("state") or "?")
    notes: list[str] = []
    if action == "suspend":
        if state == "SUSPENDING" and result.get("deadline_at"):
            notes.append("rank 0 is told to checkpoint and call go_suspend(); ranks stopped by "
                         f"{fmt_time(result.get('deadline_at'))} at the latest")
        if result.get("held", True):
            notes.append(f"held until `{PROG} resume {job_id}`")
    elif state == "SUSPENDING":
        notes.append("queued again once its ranks stopped")
    else:
        notes.append("queued at its original position: it starts when nodes are free")
    if result.get("changed") is False:
        notes.append("it already was")
    return f"{job_id}: {state}" + (f" ({'; '.join(notes)})" if notes else "")


def cmd_suspend(client: ApiClient, args: argparse.Namespace) -> int:
    result = client.suspend(args.job_id)
    if json_mode(args):
        print_json(result)
    else:
        print(_suspend_outcome(result, args.job_id, "suspend"), file=stdout())
    return EXIT_OK


def cmd_resume(client: ApiClient, args: argparse.Namespace) -> int:
    result = client.resume(args.job_id)
    if json_mode(args):
        print_json(result)
    else:
        print(_suspend_outcome(result, args.job_id, "resume"), file=stdout())
    return EXIT_OK


def _quota_cells(row: Mapping[str, Any]) -> list[Any]:
    """PRIORITY, LIMIT, SOURCE, IN USE, ROOM of one quota row (no limit: "unlimited")."""
    limit = row.get("max_nodes")
    room = row.get("room")
    return [row.get("priority_name") or row.get("priority"), "unlimited" if limit is None else limit,
            row.get("source"), row.get("used_nodes", 0), "-" if room is None else room]


_QUOTA_HEADERS = ["PRIORITY", "LIMIT", "SOURCE", "IN USE", "ROOM"]


def cmd_quota(client: ApiClient, args: argparse.Namespace) -> int:
    if args.all:
        rows: list[dict[str, Any]] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            page = client.quotas(all_users=True, next_token=token)
            rows += [r for r in page.get("quotas") or [] if isinstance(r, dict)]
            token = page.get("next_token") or None
            if not token:
                break
        if json_mode(args):
            print_json({"quotas": rows, "next_token": None})
        elif not rows:
            print("no quota set and no node in use at any level (the deployment's defaults apply)",
                  file=sys.stderr)
        else:
            for line in table(["USER", *_QUOTA_HEADERS], [[r.get("user"), *_quota_cells(r)] for r in rows]):
                print(line, file=stdout())
        return EXIT_OK
    doc = client.quotas(user=args.user)
    if json_mode(args):
        print_json(doc)
        return EXIT_OK
    levels = [r for r in doc.get("quotas") or [] if isinstance(r, dict)]
    print(f"User: {doc.get('user', args.user or '-')}", file=stdout())
    for line in table(_QUOTA_HEADERS, [_quota_cells(r) for r in levels]):
        print(line, file=stdout())
    return EXIT_OK


def cmd_events(client: ApiClient, args: argparse.Namespace) -> int:
    doc = client.events(args.job_id)
    if json_mode(args):
        print_json(doc)
        return EXIT_OK
    events = [e for e in doc.get("events") or [] if isinstance(e, dict)]
    if not events:
        print("no events", file=sys.stderr)
        return EXIT_OK
    rows = [[fmt_time(e.get("at")) or None, e.get("from"), e.get("to"), e.get("actor"), e.get("reason")]
            for e in events]
    for line in table(["AT", "FROM", "TO", "ACTOR", "REASON"], rows):
        print(line, file=stdout())
    return EXIT_OK


def reader_gone(stream: Any) -> bool:
    """True when ``stream`` is a pipe whose reading end is closed (its reader exited): a
    follower waiting for more would only learn it at its next write, maybe minutes later."""
    try:
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLERR)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # not a file (tests), or no poll() here
        return False


def _print_log_event(event: Mapping[str, Any], json_mode: bool) -> None:
    if json_mode:
        print(json.dumps(event, separators=(",", ":"), default=str), file=stdout())
    else:
        message = str(event.get("message", "")).rstrip("\n")
        stamp = fmt_time(event.get("timestamp"))
        print(f"{stamp} {message}" if stamp else message, file=stdout())
    stdout().flush()


def cmd_logs(client: ApiClient, args: argparse.Namespace) -> int:
    """Print log events page by page; with --follow keep polling until the job is terminal.

    The stream is caught up when the API says ``end_of_stream`` (the token came back
    unchanged), never because a page had no events: CloudWatch Logs answers empty pages while
    more events exist, so a page whose token moved on is followed at once. A null
    ``next_token`` means "no more for now": the next poll reuses the last token and skips
    events already printed for it.
    """
    as_json = json_mode(args)
    token: str | None = args.next_token
    printed: set[tuple[str, str]] = set()  # events printed since the token last changed
    terminal_seen = False
    while True:
        try:
            page = client.logs(args.job_id, rank=args.rank, attempt=args.attempt, next_token=token)
        except ApiError as error:
            # --follow a job that has not started (or whose stream is not there yet): wait for it.
            if not (args.follow and error.status == 404 and any(text in error.message for text in NOT_YET)):
                raise
            if str(client.get_job(args.job_id).get("state", "")).upper() in TERMINAL_STATES:
                raise
            clock.sleep(args.interval)
            continue
        fresh = 0
        for event in page.get("events") or []:
            if not isinstance(event, dict):
                continue
            key = (str(event.get("timestamp")), str(event.get("message")))
            if key in printed:
                continue
            printed.add(key)
            _print_log_event(event, as_json)
            fresh += 1
        new_token = page.get("next_token") or None
        advanced = new_token is not None and new_token != token
        if advanced:
            token, printed = new_token, set()
        more = advanced and not page.get("end_of_stream", not fresh)
        if not args.follow:
            if more:
                continue
            return EXIT_OK
        if fresh or more:
            continue  # more may be ready: drain without waiting
        # Caught up. Stop once a fetch made after seeing a terminal state found nothing new.
        if terminal_seen:
            return EXIT_OK
        state = str(client.get_job(args.job_id).get("state", "")).upper()
        if state in TERMINAL_STATES:
            terminal_seen = True
            continue
        if reader_gone(stdout()):
            return EXIT_OK  # `logs --follow | grep -m1 ...`: grep has what it wanted
        clock.sleep(args.interval)
