"""nccl-tests ``all_reduce_perf`` output, as the tool prints it: parsed, and judged.

The table rows are what nccl-tests' ``common.cu`` prints per message size
(``"%12li  %12li  %8s  %6s  %6s"`` then, out-of-place and in-place, ``"  %7s  %6.2f  %6.2f  %5g"``:
time in microseconds, algbw and busbw in GB/s, ``#wrong``; ``N/A`` for ``#wrong`` when
validation is off, ``-c 0``). It closes with ``# Out of bounds values : <n> OK|FAILED`` and
``# Avg bus bandwidth    : <mean>``. That mean covers every size, the latency-bound small
ones included (70.7 GB/s on a healthy 2 x 8 H100 run whose 8 GB busbw is 339 GB/s:
``real-captures/SOURCES.md``), so the judgement here takes the **busbw of the large
sizes**, never that line. ``busbw = algbw * 2(n-1)/n`` for all-reduce (nccl-tests'
PERFORMANCE.md): it is meant to be comparable across rank counts, which is what lets a
baseline learned at one job size judge a sub-group of another (``baseline``).

A run fails (whatever its bandwidth) when the command exited non-zero, a size reports wrong
values, the out-of-bounds count is not 0, nccl-tests reported a test failure (``Test NCCL
failure``, ``Test CUDA failure``, `` .. <host> pid <n>: Test failure``), or no large size was
measured at all. Pure: text in, values out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# The sizes the judgement reads: 128 MiB and up (latency no longer dominates: the real
# capture's busbw is 152 GB/s at 128 MiB, 339 GB/s at 8 GiB).
DEFAULT_LARGE_BYTES = 128 * 1024 * 1024
_OUT_OF_BOUNDS = re.compile(r"^#?\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?", re.IGNORECASE)
_AVG_BUSBW = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+"
                        r"\s+\[[^\]]*\]\s+(.+?)\s*$")
_FAILURE_MARKERS = ("Test NCCL failure", "Test CUDA failure", "Test failure", "NCCL error",
                    "unhandled system error", "unhandled cuda error")
MAX_ERROR_LINES = 5


@dataclass(frozen=True)
class SizeResult:
    """One row: a message size, out-of-place and in-place."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    oop_time_us: float
    oop_algbw: float
    oop_busbw: float
    oop_wrong: int | None  # None: N/A (validation off)
    ip_time_us: float | None
    ip_algbw: float | None
    ip_busbw: float | None
    ip_wrong: int | None

    @property
    def busbw(self) -> float:
        """The size's bus bandwidth: the mean of out-of-place and in-place (in-place alone
        is what training's all-reduce does; the two differ by a few GB/s at most)."""
        if self.ip_busbw is None:
            return self.oop_busbw
        return (self.oop_busbw + self.ip_busbw) / 2

    @property
    def wrong(self) -> int:
        return (self.oop_wrong or 0) + (self.ip_wrong or 0)


@dataclass(frozen=True)
class AllReduceRun:
    """What one ``all_reduce_perf`` printed."""

    rows: tuple[SizeResult, ...]
    ranks: int = 0  # "#  Rank n ..." lines (the devices in the run)
    hosts: tuple[str, ...] = ()  # hosts of those ranks, in order of appearance
    devices: tuple[str, ...] = ()  # GPU names (e.g. "NVIDIA H100 80GB HBM3"), distinct
    out_of_bounds: int | None = None  # None: the closing line is missing (cut short)
    avg_busbw: float | None = None  # the tool's mean over every size (not judged)
    errors: tuple[str, ...] = ()  # lines reporting a test failure

    def large(self, min_bytes: int = DEFAULT_LARGE_BYTES) -> tuple[SizeResult, ...]:
        return tuple(r for r in self.rows if r.size_bytes >= min_bytes)

    def large_busbw(self, min_bytes: int = DEFAULT_LARGE_BYTES) -> dict[int, float]:
        """Bus bandwidth (GB/s) per large size: what the preflight reports."""
        return {r.size_bytes: round(r.busbw, 2) for r in self.large(min_bytes)}

    def judged_busbw(self, min_bytes: int = DEFAULT_LARGE_BYTES) -> float | None:
        """The figure a baseline is compared with: the busbw of the largest size measured
        (None: no large size in the output)."""
        large = self.large(min_bytes)
        return max(large, key=lambda r: r.size_bytes).busbw if large else None

    @property
    def wrong_values(self) -> int:
        return sum(r.wrong for r in self.rows)

    def failure(self, exit_code: int | None, min_bytes: int = DEFAULT_LARGE_BYTES) -> str:
        """Why the run failed whatever its bandwidth ("" when it did not)."""
        if exit_code not in (0, None):
            return f"all_reduce_perf exited {exit_code}" + (f": {self.errors[0]}" if self.errors else "")
        if self.errors:
            return f"test failure reported: {self.errors[0]}"
        if self.wrong_values:
            bad = [r.size_bytes for r in self.rows if r.wrong][:3]
            return f"{self.wrong_values} wrong value(s) (sizes {', '.join(map(str, bad))})"
        if self.out_of_bounds:
            return f"out of bounds values: {self.out_of_bounds}"
        if not self.large(min_bytes):
            return f"no message size of {min_bytes} bytes or more in the output"
        return ""


def _number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def _wrong(token: str) -> int | None:
    if token.upper() == "N/A":
        return None
    value = _number(token)
    return int(value) if value is not None else None


def _row(line: str) -> SizeResult | None:
    tokens = line.split()
    if len(tokens) < 9 or not tokens[0].isdigit() or not tokens[1].isdigit():
        return None
    # size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
    oop = [_number(t) for t in tokens[5:8]]
    if any(v is None for v in oop):
        return None
    ip = [_number(t) for t in tokens[9:12]] if len(tokens) >= 13 else [None, None, None]
    if any(v is None for v in ip):
        ip = [None, None, None]
    return SizeResult(
        size_bytes=int(tokens[0]), count=int(tokens[1]), dtype=tokens[2], redop=tokens[3],
        oop_time_us=float(oop[0] or 0.0), oop_algbw=float(oop[1] or 0.0), oop_busbw=float(oop[2] or 0.0),
        oop_wrong=_wrong(tokens[8]),
        ip_time_us=ip[0], ip_algbw=ip[1], ip_busbw=ip[2],
        ip_wrong=_wrong(tokens[12]) if ip[0] is not None else None,
    )


def parse_all_reduce_perf(text: str | Iterable[str]) -> AllReduceRun:
    """The table and closing lines of ``all_reduce_perf`` output. Lines it does not know
    (NCCL INFO lines, a launcher's prefix-less chatter) are skipped; a line prefixed the way
    a log shipper does it (``[rank 0] ...``) is read after its prefix."""
    lines = text.splitlines() if isinstance(text, str) else list(text)
    rows: list[SizeResult] = []
    hosts: list[str] = []
    devices: list[str] = []
    ranks = 0
    out_of_bounds: int | None = None
    avg: float | None = None
    errors: list[str] = []
    for raw in lines:
        line = raw.strip()
        if line.startswith("[") and "]" in line:  # "[rank 0] ..." as the playground's log has it
            line = line.split("]", 1)[1].strip()
        if not line:
            continue
        rank = _RANK_LINE.match(line)
        if rank:
            ranks += 1
            if rank.group(2) not in hosts:
                hosts.append(rank.group(2))
            if rank.group(3) not in devices:
                devices.append(rank.group(3))
            continue
        bounds = _OUT_OF_BOUNDS.match(line)
        if bounds:
            out_of_bounds = int(bounds.group(1))
            continue
        mean = _AVG_BUSBW.match(line)
        if mean:
            avg = _number(mean.group(1))
            continue
        if any(marker.lower() in line.lower() for marker in _FAILURE_MARKERS):
            if len(errors) < MAX_ERROR_LINES:
                errors.append(line[:300])
            continue
        if line.startswith("#"):
            continue
        row = _row(line)
        if row is not None:
            rows.append(row)
    return AllReduceRun(rows=tuple(rows), ranks=ranks, hosts=tuple(hosts), devices=tuple(devices),
                        out_of_bounds=out_of_bounds, avg_busbw=avg, errors=tuple(errors))


def table_lines(text: str, max_lines: int = 64) -> str:
    """The part of a long output the stack keeps and parses: the rank lines, the table and
    the closing lines (NCCL's INFO chatter dropped), at most ``max_lines`` lines."""
    kept = []
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        body = stripped.split("]", 1)[1].strip() if stripped.startswith("[") and "]" in stripped else stripped
        if body.startswith("#") or _row(body) is not None or \
                any(marker.lower() in body.lower() for marker in _FAILURE_MARKERS):
            kept.append(line)
    if len(kept) > max_lines:  # the rank lines go first: a 1,024-rank run lists 8,192 devices
        head = [k for k in kept if _RANK_LINE.match(k.strip())][:4]
        rest = [k for k in kept if not _RANK_LINE.match(k.strip())]
        kept = head + rest[-(max_lines - len(head)):]
    return "\n".join(kept)
