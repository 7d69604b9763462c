"""What a check of ``gpu-recovery-admin doctor`` finds, and how it is printed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from botocore.exceptions import ClientError

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
LISTED = 8  # names shown per line before "and N more"
REDEPLOY = "redeploy this version of the stack (make deploy CDK_ARGS=...)"


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    detail: str
    fix: str = ""



def error_text(error: Exception) -> str:
    if isinstance(error, ClientError):
        info = error.response.get("Error", {})
        return f"{info.get('Code', 'Error')}: {info.get('Message', '')}".rstrip(": ")
    return f"{type(error).__name__}: {error}"


def listing(items: Sequence[str], limit: int = LISTED) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def render(findings: Sequence[Finding], header: str = "") -> str:
    width = max([len(f.check) for f in findings] + [5])
    lines = [header] if header else []
    for f in findings:
        lines.append(f"{f.status:<4}  {f.check:<{width}}  {f.detail}")
        if f.fix and f.status in (FAIL, WARN):
            lines.append(f"{'':<4}  {'':<{width}}  fix: {f.fix}")
    counts = {s: sum(1 for f in findings if f.status == s) for s in (PASS, WARN, FAIL, SKIP)}
    lines.append(f"{counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failed"
                 + (f", {counts[SKIP]} skipped" if counts[SKIP] else ""))
    return "\n".join(lines)
