"""One all-reduce of a preflight round, judged: passed, slow, failed, or hung.

A report carries what the command printed (``all_reduce_perf``'s table, or the client's
own all-reduce printing the same table) and its exit code. It **fails** on anything
``nccl_output.AllReduceRun.failure`` names (exit code, wrong values, out-of-bounds values,
a test failure line, no large size), it is **slow** when the busbw of its largest size is
under the threshold (``baseline``), and a test nobody reported by the round's deadline
**hung**. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery.domain.preflight.baseline import Threshold
from gpu_recovery.domain.preflight.nccl_output import DEFAULT_LARGE_BYTES, parse_all_reduce_perf

PASSED, SLOW, FAILED, HUNG = "passed", "slow", "failed", "hung"


@dataclass(frozen=True)
class Verdict:
    outcome: str
    busbw: float | None = None  # the judged figure: busbw of the largest size (GB/s)
    large: Mapping[int, float] = field(default_factory=dict)  # busbw per large size
    threshold: Threshold = field(default_factory=lambda: Threshold(None, ""))
    reason: str = ""
    seconds: float | None = None  # how long the test took, as its runner measured

    @property
    def passed(self) -> bool:
        return self.outcome == PASSED

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.outcome, "threshold": self.threshold.to_dict(),
                               "reason": self.reason[:300]}
        if self.busbw is not None:
            out["busbw"] = round(self.busbw, 2)
        if self.large:
            out["large"] = {str(k): v for k, v in self.large.items()}
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 1)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> Verdict:
        raw = raw or {}
        busbw = raw.get("busbw")
        seconds = raw.get("seconds")
        return cls(outcome=str(raw.get("outcome") or FAILED),
                   busbw=None if busbw is None else float(busbw),
                   large={int(k): float(v) for k, v in (raw.get("large") or {}).items()},
                   threshold=Threshold.from_dict(raw.get("threshold")), reason=str(raw.get("reason") or ""),
                   seconds=None if seconds is None else float(seconds))

    def line(self) -> str:
        """One line for a history, an e-mail, ``gpujobs status``."""
        bw = f"busbw {self.busbw:.1f} GB/s" if self.busbw is not None else "no busbw"
        held = f" vs {self.threshold.gbps:.1f} GB/s" if self.threshold.gbps is not None else ""
        return f"{self.outcome} ({bw}{held}){': ' + self.reason if self.reason else ''}"


def judge(output: str, exit_code: int | None, threshold: Threshold, *, seconds: float | None = None,
          min_bytes: int = DEFAULT_LARGE_BYTES) -> Verdict:
    """A report judged against ``threshold``."""
    run = parse_all_reduce_perf(output)
    large = run.large_busbw(min_bytes)
    busbw = run.judged_busbw(min_bytes)
    why = run.failure(exit_code, min_bytes)
    if why:
        return Verdict(FAILED, busbw, large, threshold, why, seconds)
    assert busbw is not None  # failure() names a run without large sizes
    if threshold.slow(busbw):
        return Verdict(SLOW, busbw, large, threshold,
                       f"busbw {busbw:.1f} GB/s at {max(large)} bytes under {threshold.gbps:.1f} GB/s "
                       f"({threshold.source})", seconds)
    return Verdict(PASSED, busbw, large, threshold, "", seconds)


def hung(threshold: Threshold, waited_seconds: float) -> Verdict:
    """A test whose report never came (its group hung, a rank never joined)."""
    why = f"no report within {waited_seconds:.0f} s (hung, or a rank never joined)"
    return Verdict(HUNG, None, {}, threshold, why)


_FIGURES = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def alike_everywhere(failed: Sequence[str], nodes: int) -> str:
    """Why round 1's loopbacks say the job's own image or code failed, not a node ("" when
    they do not): on a job of 2 or more nodes, every node's loopback failed the same way (the
    same outcome and reason, figures aside: "exit code 1" everywhere, every node slow alike).
    ``failed``: the item's ``rank|outcome|reason`` entries. (No report at all is missing
    evidence, not bad evidence: the preflight's caller decides, not this.)"""
    if nodes < 2:
        return ""
    entries = [str(e).split("|", 2) for e in failed]
    ranks = {int(e[0]) for e in entries if e and e[0].isdigit()}
    if len(ranks) < nodes:
        return ""
    ways = {(e[1] if len(e) > 1 else "", _FIGURES.sub("#", e[2] if len(e) > 2 else "")) for e in entries}
    if len(ways) != 1:
        return ""
    outcome = entries[0][1] if len(entries[0]) > 1 else FAILED
    reason = entries[0][2] if len(entries[0]) > 2 else ""
    return f"every node's loopback {outcome} alike (all {nodes}){': ' + reason if reason else ''}"
