"""Goodput views of the CLI: a job's ledger (``gpujobs show``) and a summary of a user's
jobs over a period (``gpujobs goodput``), from the ledgers the jobs API returns
(docs/goodput.md says what each cause means)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from typing import Any

from cli.gpujobs import clock  # the module (tests replace its utcnow)
from cli.gpujobs.client import ApiClient
from cli.gpujobs.constants import EXIT_OK
from cli.gpujobs.errors import CliError
from cli.gpujobs.render import fmt_duration, json_mode, parse_time, print_json, stdout, table

# The causes in the order shown (the jobs API's keys); the job's own are marked.
STACK_CAUSES = ("lost_work", "detection", "stopping", "diagnosis", "repair", "validation",
                "waiting_for_capacity", "restart", "preflight")
OWN_CAUSES = ("suspended", "preempted", "queued", "application_error")
MAX_PAGES = 200  # 100 jobs a page: 20,000 jobs at most in a summary
_PERIOD = re.compile(r"^(\d{1,4})([hd])$")


def _ettr(value: Any) -> str:
    return "-" if value is None else f"{float(value) * 100:.1f} %"


def _share(seconds: float, wall: float) -> str:
    return f"{seconds / wall * 100:.1f} %" if wall > 0 else "-"


def ledger_lines(ledger: Mapping[str, Any]) -> list[str]:
    """The ``show`` view of a job's ledger: one row per cause with time (none: no row)."""
    wall = float(ledger.get("wall_seconds") or 0)
    if wall <= 0:
        return []
    seconds = {k: float(v) for k, v in dict(ledger.get("seconds") or {}).items()}
    rows: list[list[Any]] = [["productive", fmt_duration(seconds.get("productive", 0)),
                              _share(seconds.get("productive", 0), wall), ""]]
    unknown = int(ledger.get("lost_work_unknown_faults") or 0)
    for cause in STACK_CAUSES:
        value = seconds.get(cause, 0.0)
        if cause == "lost_work" and unknown:
            note = f"unknown for {unknown} fault(s): no checkpoint reported"
            rows.append([cause, fmt_duration(value) if value else "unknown", _share(value, wall), note])
        elif value:
            rows.append([cause, fmt_duration(value), _share(value, wall), ""])
    rows += [[cause, fmt_duration(seconds[cause]), _share(seconds[cause], wall), "the job's own"]
             for cause in OWN_CAUSES if seconds.get(cause)]
    lines = ["", f"Goodput:    ETTR {_ettr(ledger.get('ettr'))} of {fmt_duration(wall)} wall "
                 f"({int(ledger.get('faults') or 0)} fault(s); the stack's own share "
                 f"{fmt_duration(float(ledger.get('stack_share_seconds') or 0))})"]
    lines += table(["CAUSE", "TIME", "SHARE", "NOTE"], rows, indent="  ")
    costly = [n for n in ledger.get("top_nodes") or [] if isinstance(n, Mapping)]
    if costly:
        lines.append("  costliest nodes: " + ", ".join(
            f"{n.get('name')} {fmt_duration(float(n.get('seconds') or 0))}" for n in costly[:3]))
    rules = [n for n in ledger.get("top_rules") or [] if isinstance(n, Mapping)]
    if rules:
        lines.append("  costliest faults: " + ", ".join(
            f"{n.get('name')} {fmt_duration(float(n.get('seconds') or 0))}" for n in rules[:3]))
    return lines


def period_seconds(text: str) -> float:
    """``7d`` / ``36h`` -> seconds."""
    match = _PERIOD.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a period like 7d or 36h")
    return int(match.group(1)) * (86400 if match.group(2) == "d" else 3600)


def summarise(jobs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """GPU-hours per cause over ``jobs`` (each job's ledger times its GPUs) and the ETTR of
    them all: productive / (wall - the jobs' own time), GPU-weighted."""
    hours: dict[str, float] = {}
    count = unknown = 0
    for job in jobs:
        ledger = job.get("goodput") if isinstance(job.get("goodput"), Mapping) else None
        if not ledger or not float(ledger.get("wall_seconds") or 0):
            continue
        count += 1
        gpus = max(1, int(job.get("nnodes") or 1) * max(1, int(job.get("gpus_per_node") or 1)))
        for cause, value in dict(ledger.get("seconds") or {}).items():
            hours[cause] = hours.get(cause, 0.0) + float(value) * gpus / 3600
        unknown += int(ledger.get("lost_work_unknown_faults") or 0)
    wall = sum(hours.values())
    own = sum(hours.get(c, 0.0) for c in OWN_CAUSES)
    base = wall - own
    return {"jobs": count, "gpu_hours": {c: round(v, 3) for c, v in hours.items() if v},
            "wall_gpu_hours": round(wall, 3), "own_gpu_hours": round(own, 3),
            "ettr": round(hours.get("productive", 0.0) / base, 4) if base > 0 else None,
            "lost_work_unknown_faults": unknown}


def cmd_goodput(client: ApiClient, args: argparse.Namespace) -> int:
    """The user's jobs submitted within the period (newest first, the list's own order)."""
    since = clock.utcnow().timestamp() - args.since
    jobs: list[dict[str, Any]] = []
    token = None
    for _ in range(MAX_PAGES):
        page = client.list_jobs(user=args.user, limit=100, next_token=token)
        listed = [j for j in page.get("jobs") or [] if isinstance(j, dict)]
        recent = [j for j in listed if (_epoch(j.get("submitted_at")) or 0) >= since]
        jobs += recent
        token = page.get("next_token")
        if not token or len(recent) < len(listed):
            break
    else:
        raise CliError(f"more than {MAX_PAGES * 100} jobs in the period: ask for a shorter one")
    summary = summarise(jobs)
    if json_mode(args):
        print_json({**summary, "since": since, "user": args.user})
        return EXIT_OK
    out = stdout()
    if not summary["jobs"]:
        print("no job started in the period", file=out)
        return EXIT_OK
    wall = summary["wall_gpu_hours"]
    print(f"{summary['jobs']} job(s), {wall:.1f} GPU-hours, ETTR {_ettr(summary['ettr'])}", file=out)
    hours = summary["gpu_hours"]
    causes = [c for c in ("productive", *STACK_CAUSES, *OWN_CAUSES) if hours.get(c)]
    rows = [[c, f"{hours[c]:.2f}", _share(hours[c], wall), "the job's own" if c in OWN_CAUSES else ""]
            for c in causes]
    for line in table(["CAUSE", "GPU-HOURS", "SHARE", "NOTE"], rows):
        print(line, file=out)
    if summary["lost_work_unknown_faults"]:
        print(f"lost work unknown for {summary['lost_work_unknown_faults']} fault(s): their jobs reported "
              "no checkpoint (gpu_recovery_client.checkpoint_saved)", file=out)
    return EXIT_OK


def _epoch(value: Any) -> float | None:
    parsed = parse_time(value)
    return parsed.timestamp() if parsed is not None else None
