"""What ``gpu-recovery-admin``'s reads print for people (``--json``: the document itself, for
scripts): labelled lines and tables, times as UTC ISO 8601 with how long ago."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any


def when(at: Any, now: float) -> str:
    """An epoch time as ``2026-11-20T14:32:01Z (3 min ago)``; ``-`` when there is none."""
    if at in (None, "", 0):
        return "-"
    try:
        seconds = float(at)
    except (TypeError, ValueError):
        return str(at)
    stamp = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp} ({ago(now - seconds)})"


def ago(seconds: float) -> str:
    later = seconds < 0
    seconds = abs(int(seconds))
    amount = (f"{seconds} s" if seconds < 120 else f"{seconds // 60} min" if seconds < 7200
              else f"{seconds // 3600} h")
    return f"in {amount}" if later else f"{amount} ago"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    rows = [list(headers), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    return ["  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip() for row in rows]


def _labelled(pairs: Sequence[tuple[str, str]]) -> list[str]:
    width = max(len(label) for label, _ in pairs) + 1
    return [f"{label + ':':<{width}} {value}" for label, value in pairs]


def breaker_lines(shown: Mapping[str, Any], now: float) -> list[str]:
    """``breaker show``: the breaker's standing and why, its limit and window, trips, backlog,
    cordons and held jobs, for a person."""
    window_minutes = float(shown.get("window_seconds") or 600) / 60
    limit, nodes = shown.get("limit"), shown.get("cluster_gpu_nodes")
    in_window = list(shown.get("nodes_in_window") or [])
    cordons = shown.get("cordons") or {}
    trip = (f", last at {when(shown.get('tripped_at'), now)}: {shown.get('trip_reason')}"
            if shown.get("tripped_at") else "")
    lines = _labelled([
        ("Breaker", f"{shown.get('standing')}: {shown.get('why')}"),
        ("Limit", (f"{limit} node action(s) per {window_minutes:g} min" if limit is not None
                   else f"not set yet (none acted on in a {window_minutes:g} min window)")
         + (f", {nodes} GPU nodes counted" if nodes is not None else "")),
        ("In the window", ", ".join(in_window) if in_window else "no node acted on"),
        ("Trips", f"{shown.get('trips', 0)}{trip}"),
        ("Acted on", ", ".join(shown.get("nodes_acted_on_when_tripped") or []) or "-"),
        ("Cordon limit", f"{cordons.get('state', 'closed')}, {cordons.get('trips', 0)} trip(s)"),
        ("Last reset", f"{when(shown.get('last_reset_at'), now)}"
                       + (f" by {shown.get('last_reset_by')}" if shown.get("last_reset_by") else "")),
    ])
    backlog = list(shown.get("backlog") or [])
    lines.append("")
    if backlog:
        lines += ["Backlog (held-back node actions):",
                  *("  " + line for line in table(["NODE", "ACTION", "SINCE", "JOB", "REASON"], [
                      [str(e.get("node")), str(e.get("action")), when(e.get("at"), now),
                       str(e.get("job_id") or "-"), str(e.get("reason") or "")[:80]] for e in backlog]))]
    else:
        lines.append("Backlog: none")
    released = list(shown.get("released_not_yet_carried_out") or [])
    if released:
        lines.append("Released, not carried out yet: "
                     + ", ".join(f"{e.get('node')} ({e.get('action')})" for e in released))
    held = list(shown.get("held_jobs") or [])
    if held:
        lines += ["Jobs HELD for a held-back reboot:",
                  *("  " + line for line in table(["JOB", "NODES", "UNTIL"], [
                      [str(j.get("job_id")), ", ".join(j.get("nodes") or []), when(j.get("until"), now)]
                      for j in held]))]
    else:
        lines.append("Jobs HELD: none")
    return lines


def reset_lines(result: Mapping[str, Any]) -> list[str]:
    """``breaker reset``: the new state and each backlog entry released or dropped."""
    lines = [f"Breaker: {result.get('state')}"]
    for what in ("released", "dropped"):
        entries = list(result.get(what) or [])
        lines.append(f"{what.capitalize()}: " + (", ".join(
            f"{e.get('node')} ({e.get('action')})" if isinstance(e, Mapping) else str(e) for e in entries)
            or "none"))
    return lines


def token_lines(rows: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    """``list-tokens``: one line per node token (never the token)."""
    if not rows:
        return []
    return table(["NODE", "STATUS", "ISSUED", "BY", "HASH", "REVOKED"], [
        [str(r.get("node_id")), str(r.get("token_status", "-")), when(r.get("issued_at"), now),
         str(r.get("issued_by") or "-"), str(r.get("hash_prefix") or "-"),
         when(r.get("revoked_at"), now) if r.get("revoked_at") else "-"] for r in rows])
