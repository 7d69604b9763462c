"""What the heartbeat service answers: a report's or a sweep's outcome, or a replayed report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ReplayedReport(Exception):
    """The node's last accepted report carried this very timestamp (a repeat)."""



@dataclass
class ReportResult:
    node_id: str
    refreshed: int = 0
    unknown: list[str] = field(default_factory=list)
    ignored: dict[str, str] = field(default_factory=dict)  # task -> why (e.g. rank STOPPED)
    revived: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    unhung: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id, "refreshed": self.refreshed, "unknown": self.unknown,
            "ignored": self.ignored, "revived": self.revived, "hung": self.hung,
            "unhung": self.unhung,
        }


@dataclass
class GpuResult:
    node_id: str
    gpus: int
    signals: list[str] = field(default_factory=list)
    new_signals: list[str] = field(default_factory=list)
    suspect: bool = False
    notified: bool = False
    suppressed: list[str] = field(default_factory=list)  # new, held back by the rate limit
    warning: str = ""  # the catalog rule of the driver warning this report raised ("": none)

    def as_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "gpus": self.gpus, "signals": self.signals,
                "new_signals": self.new_signals, "suspect": self.suspect,
                "notified": self.notified, "suppressed": self.suppressed, "warning": self.warning}


@dataclass
class SweepResult:
    read: int = 0
    marked_lost: list[str] = field(default_factory=list)
    escalated: list[str] = field(default_factory=list)
    # jobs whose lost node's ECS agent read disconnected, waiting for the reading that confirms it
    confirming: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    unwatched: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"read": self.read, "marked_lost": self.marked_lost, "escalated": self.escalated,
                "confirming": self.confirming, "failed": self.failed, "unwatched": self.unwatched}

