"""How jobs are shown: times, durations, tables, the ``show`` view; JSON or text."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

from cli.gpujobs.constants import AUTO_PRIORITY, PROG


def stdout() -> TextIO:
    return sys.stdout


def print_json(doc: Any) -> None:
    print(json.dumps(doc, indent=2, sort_keys=False, default=str), file=stdout())


def parse_time(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if value <= 0:
            return None  # "not set"
        seconds = value / 1000.0 if value > 1e11 else float(value)  # epoch ms or s
        return datetime.fromtimestamp(seconds, UTC)
    text = str(value).strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return parse_time(float(text))
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def fmt_time(value: Any) -> str:
    parsed = parse_time(value)
    if parsed is None:
        return "" if value is None else str(value)
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    return (f"{days}d " if days else "") + f"{hours:d}:{minutes:02d}:{secs:02d}"


def short_arn(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.rsplit("/", 1)[-1] if text.startswith("arn:") else text


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value).replace("\n", " ")


def table(headers: list[str], rows: list[list[Any]], indent: str = "") -> list[str]:
    cells = [[cell(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        padded = [v.ljust(widths[i]) if i < len(values) - 1 else v for i, v in enumerate(values)]
        return (indent + "  ".join(padded)).rstrip()

    return [line(headers)] + [line(r) for r in cells]


def _dict_at(item: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``item[key]`` when it is an object, else empty (the view tolerates missing fields)."""
    value = item.get(key)
    return value if isinstance(value, dict) else {}


def _list_at(item: Mapping[str, Any], key: str) -> list[Any]:
    """``item[key]`` when it is a list, else empty."""
    value = item.get(key)
    return value if isinstance(value, list) else []


def nodes_label(job: Mapping[str, Any]) -> str:
    spec = _dict_at(job, "spec")
    nnodes = job.get("nnodes", spec.get("nnodes"))
    gpus = job.get("gpus_per_node", spec.get("gpus_per_node"))
    if nnodes is None:
        return "-"
    return f"{nnodes}x{gpus}" if gpus is not None else str(nnodes)


def rank_counts(job: Mapping[str, Any]) -> tuple[int, int, str]:
    """(ranks counted, the job's ranks, what was counted): the ranks running; or, for an answer
    holding a page of a large job's ranks, its ``ranks_live`` (the attempt's ranks started and not
    ended, which a page cannot tell running from starting), said as such."""
    ranks = _list_at(job, "ranks")
    running = sum(1 for r in ranks if isinstance(r, dict) and str(r.get("state", "")).upper() == "RUNNING")
    counted = "running"
    live = job.get("ranks_live")
    if isinstance(live, int) and not isinstance(live, bool):
        running, counted = live, "started, not ended"
    spec = _dict_at(job, "spec")
    total = job.get("nnodes") or spec.get("nnodes") or len(ranks)
    try:
        total = int(total)
    except (TypeError, ValueError):
        total = len(ranks)
    return running, max(total, len(ranks)), counted


_PRIORITY_NAMES = {0: "LOW", 5: "BELOW_NORMAL", 10: "NORMAL", 20: "ABOVE_NORMAL", 30: "HIGH",
                   40: "VERY_HIGH", 50: "EXTREME_HIGH"}


def _priority(job: Mapping[str, Any]) -> Any:
    spec = _dict_at(job, "spec")
    value = job.get("priority", spec.get("priority"))
    name = job.get("priority_name") or (_PRIORITY_NAMES.get(value) if isinstance(value, int) else None)
    if name and str(name) != str(value) and value is not None:
        return f"{name} ({value})"
    return value


def _priority_detail(job: Mapping[str, Any]) -> Any:
    """``show``'s priority: the level, and how it came to be (AUTO at submit, a demotion)."""
    shown = _priority(job)
    notes = []
    if str(job.get("priority_requested") or "").upper() == AUTO_PRIORITY:
        notes.append(f"chosen by {AUTO_PRIORITY} at submit")
    demoted = job.get("demoted_from")
    if demoted is not None and demoted != "":
        name = _PRIORITY_NAMES.get(demoted) if isinstance(demoted, int) else None
        notes.append(f"demoted from {name} ({demoted})" if name else f"demoted from {demoted}")
    if shown is None or not notes:
        return shown
    return f"{shown}, {', '.join(notes)}"


def state_label(job: Mapping[str, Any]) -> str:
    """The state, marked ``(held)`` for a job suspended by its user: it waits for ``resume``."""
    state = str(job.get("state", "?"))
    return f"{state} (held)" if job.get("held") else state


def _suspension_lines(job: Mapping[str, Any]) -> list[str]:
    """The suspension block of ``show``: the current one, or the last one once resumed."""
    raw = job.get("suspend")
    if not isinstance(raw, dict) or not raw:
        return []
    state = str(job.get("state", "")).upper()
    current = state in ("SUSPENDING", "SUSPENDED")
    kind = str(raw.get("kind") or "-")
    by_text = ", ".join(f"{what} {raw[key]}" for what, key in (("job", "by_job"), ("user", "by_user"))
                        if raw.get(key))
    deadline = fmt_time(raw.get("deadline_at")) or None
    grace = raw.get("grace_seconds")
    if deadline and grace:
        deadline = f"{deadline} (grace {grace} s)"
    held = None
    moving = kind == "moved"
    if state == "SUSPENDED":
        held = (f"yes: waits for `{PROG} resume {job.get('job_id', 'ID')}`" if job.get("held")
                else "no: queued again ahead of its priority, restarts on healthy nodes" if moving
                else "no: queued again at its original position")
    elif state == "SUSPENDING":
        held = "yes, once its ranks stopped" if raw.get("hold") else "no: queued again once its ranks stopped"
        if moving:
            deadline = f"{deadline}: no go_suspend() by then, it keeps running there" if deadline else None
    stopped = raw.get("stop_reason") or None
    if stopped and raw.get("stop_requested_at"):
        stopped = f"{fmt_time(raw.get('stop_requested_at'))}: {stopped}"
    fields: list[tuple[str, Any]] = [
        ("Kind", kind + (f" (by {by_text})" if by_text else "")),
        ("Reason", raw.get("reason") or None),
        ("Requested", fmt_time(raw.get("requested_at")) or None),
        # A past suspension's deadline says nothing any more; the current one's is the forced stop.
        ("Deadline", deadline if current else None),
        ("Stopped", stopped),
        ("Held", held),
    ]
    title = "Suspension:" if current else "Last suspension:"
    return ["", title] + [f"  {label + ':':<10} {cell(value)}" for label, value in fields
                          if value not in (None, "")]


def _preflight_lines(job: Mapping[str, Any]) -> list[str]:
    """The attempt's gang preflight, when it ran one: its verdict, a line per round, the nodes
    it pinned."""
    pre = job.get("preflight")
    if not isinstance(pre, dict) or not pre.get("status"):
        return []
    lines = ["", f"Preflight (attempt {pre.get('attempt')}, {pre.get('mode', 'auto')}): "
                 f"{pre.get('status')}, round {pre.get('round')}"]
    if pre.get("verdict"):
        lines.append(f"  {cell(pre['verdict'])}")
    lines += [f"  {cell(line)}" for line in pre.get("summary") or []]
    for pin in pre.get("pinned") or []:
        if isinstance(pin, dict):
            lines.append(f"  pinned rank {pin.get('rank')} on {pin.get('node')}: {cell(pin.get('reason'))}")
    return lines


MOVE_OUTCOMES = {"moved": "moved at its checkpoint",
                 "declined": "not moved: no checkpoint in time, kept running"}


def _moves_lines(job: Mapping[str, Any]) -> list[str]:
    """Why the job moved (or was asked to) off a node with a driver warning, and what it avoided."""
    moves = [m for m in job.get("moves") or [] if isinstance(m, dict)]
    if not moves:
        return []
    rows = []
    for move in moves:
        sure = "announced by the driver" if move.get("confidence") == "announced" else "predicted (a counter)"
        seconds = move.get("checkpoint_seconds")
        took = f" in {seconds:g} s" if isinstance(seconds, int | float) else ""
        rows.append([fmt_time(move.get("at")) or None, short_arn(move.get("node")),
                     MOVE_OUTCOMES.get(str(move.get("outcome")), str(move.get("outcome"))) + took,
                     f"{move.get('action') or '?'} {sure}", move.get("rule") or None])
    avoided = ("Avoided: a crash on a GPU the driver warned about (the work since the last checkpoint plus a "
               "whole recovery)") if any(m.get("outcome") == "moved" for m in moves) else None
    return ["", "Moves off nodes with a driver warning:",
            *table(["AT", "NODE", "OUTCOME", "WARNING", "RULE"], rows, indent="  "),
            *([f"  {avoided}"] if avoided else [])]


def _rank_table(ranks: list[dict[str, Any]]) -> list[str]:
    columns: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("RANK", lambda r: r.get("rank")),
        ("STATE", lambda r: r.get("state")),
        ("TASK", lambda r: short_arn(r.get("task_arn"))),
        ("CONTAINER INSTANCE",
         lambda r: short_arn(r.get("container_instance") or r.get("container_instance_id"))),
        ("EC2 INSTANCE", lambda r: r.get("ec2_instance_id")),
        ("LAST HEARTBEAT", lambda r: fmt_time(r.get("last_heartbeat_at"))),
        ("EXIT", lambda r: r.get("exit_code")),
        ("STOP REASON", lambda r: r.get("stop_reason")),
    ]
    always = {"RANK", "STATE", "TASK", "CONTAINER INSTANCE", "LAST HEARTBEAT"}
    values = [[get(r) for _, get in columns] for r in ranks]
    keep = [i for i, (title, _) in enumerate(columns)
            if title in always or any(row[i] not in (None, "") for row in values)]
    rows = [[row[i] if row[i] not in ("",) else None for i in keep] for row in values]
    return table([columns[i][0] for i in keep], rows, indent="  ")


def format_job(job: Mapping[str, Any]) -> list[str]:
    """The human ``show`` view; tolerant of missing fields and of extra ones."""
    spec = _dict_at(job, "spec")
    overrides = _dict_at(spec, "overrides")
    name = job.get("name") or spec.get("name")
    lines = [f"Job:        {job.get('job_id', '-')}" + (f"  ({name})" if name else "")]
    running, total, counted = rank_counts(job)
    nodes = nodes_label(job)
    max_recoveries = job.get("max_recovery_attempts", spec.get("max_recovery_attempts"))
    recoveries = None
    if max_recoveries is not None:
        used = job.get("recoveries_used")
        recoveries = f"{used}/{max_recoveries} used" if used is not None else f"max {max_recoveries}"
    labels = _dict_at(spec, "labels")
    counts = [int(job.get("suspend_count") or 0), int(job.get("resume_count") or 0)]
    state = job.get("state")
    if state is not None and job.get("held"):
        state = f"{state}, held until resumed"
    fields: list[tuple[str, Any]] = [
        ("State", state),
        ("Waiting", job.get("wait_reason") or None),
        ("User", job.get("user")),
        ("Quota user", job.get("quota_user") or None),
        ("Priority", _priority_detail(job)),
        ("Submitted", fmt_time(job.get("submitted_at")) or None),
        ("Task def", spec.get("task_definition")),
        ("Nodes", f"{nodes} GPUs" if nodes != "-" else None),
        ("Attempt", job.get("attempt")),
        ("Recoveries", recoveries),
        ("Suspended", f"{counts[0]} time(s), resumed {counts[1]}" if any(counts) else None),
        ("Ranks", f"{running}/{total} {counted}" if total else None),
        ("Command", " ".join(shlex.quote(str(c)) for c in overrides.get("command") or []) or None),
        ("Labels", ", ".join(f"{k}={v}" for k, v in labels.items()) or None),
        ("Last error", job.get("last_error")),
    ]
    lines += [f"{label + ':':<11} {cell(value)}" for label, value in fields if value not in (None, "")]
    lines += _suspension_lines(job)
    lines += _preflight_lines(job)
    lines += _moves_lines(job)
    ranks = [r for r in job.get("ranks") or [] if isinstance(r, dict)]
    if ranks:
        lines += ["", "Ranks:", *_rank_table(ranks)]
        following = job.get("ranks_next")
        if isinstance(following, int) and not isinstance(following, bool):
            lines.append(f"  ranks {ranks[0].get('rank')}-{ranks[-1].get('rank')} of {rank_counts(job)[1]}: "
                         f"--ranks-from {following} for the next")
    attempts = [a for a in job.get("attempts") or [] if isinstance(a, dict)]
    if attempts:
        lines += ["", "Attempts:"]
        lines += table(["ATTEMPT", "STARTED", "ENDED", "OUTCOME", "FAILURE", "REASON"],
                        [[a.get("attempt"), fmt_time(a.get("started_at")) or None,
                          fmt_time(a.get("ended_at")) or None, a.get("outcome") or None,
                          a.get("failure_kind") or None, a.get("reason") or None] for a in attempts],
                        indent="  ")
    return lines


def json_mode(args: argparse.Namespace) -> bool:
    return bool(args.json or getattr(args, "sub_json", False))

