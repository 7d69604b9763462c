"""A fault's tally: what a job knows about the verdicts of its suspect nodes, as counts.

The job item carries counts, never the per-node verdicts (those are items of their own,
one per suspect node): how many suspects were decided, how many were fatal (the node is
unusable: replace, quarantine, operator action, timeout, unavailable, held back), how many
of those are reboots the blast-radius breaker held back (``held``), how many need a
reboot, how many rebooting nodes the restart still waits for, and - once every
rank of the attempt has ended, so no suspect can be added any more - how many suspects
there are. The job's fate follows from these counts alone. Healthy verdicts that change
nothing else on the job are counted off it, on the fault's tally shards (no hot item: a
large fault's verdicts would all write the job item); ``shard_decided``, ``shard_infra`` and
``shard_undiagnosed`` are their sums where the repository read them
(``FaultRepository.counted``), 0 otherwise. A suspect the stack's own check could not judge
(undiagnosed) leaves a fault no other check found no one's to pay: while one is counted and
none was found bad, the fault spends no budget however the other verdicts read. A shard holds
the nodes it counted (a set: counting twice changes nothing), so the job's size sets how many
shards there are (:func:`tally_shard_count`) and no shard holds more than about
``TALLY_NODES_PER_SHARD`` nodes. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpu_recovery.domain.states import FATAL_SUSPECT_VERDICTS, JobOutcome, SuspectVerdict

# A fault's suspects are at most its ranks: with a shard per this many ranks, no shard's
# set of counted nodes grows past it (at most ~4 KB whatever the job's size; fewer shards
# mean fewer items read by each verdict that adds them) ...
TALLY_NODES_PER_SHARD = 128
MIN_TALLY_SHARDS = 8
# ... and every shard is read by one BatchGetItem (at most 100 keys).
MAX_TALLY_SHARDS = 100


def tally_shard_count(world_size: int) -> int:
    """How many shards the healthy verdicts of a fault of a job of ``world_size`` ranks are
    counted on (the writer and every reader derive it from the job alike)."""
    wanted = -(-max(1, world_size) // TALLY_NODES_PER_SHARD)
    return max(MIN_TALLY_SHARDS, min(MAX_TALLY_SHARDS, wanted))


@dataclass(frozen=True)
class FaultTally:
    attempt: int = 0
    decided: int = 0
    fatal: int = 0
    reboot: int = 0
    rebooting: int = 0  # nodes rebooting that the gang restart waits for
    total: int | None = None  # suspects of the fault; known once every rank of the attempt ended
    infra: int = 0  # healthy verdicts the catalog charges to the infrastructure budget (transient)
    # Fatal verdicts that are only a reboot the breaker held back: a job that cannot move
    # waits for the breaker's reset (HELD) instead of failing for them.
    held: int = 0
    shard_decided: int = 0  # healthy verdicts counted on the tally shards (not on the job item)
    shard_infra: int = 0  # of which charged to the infrastructure budget
    undiagnosed: int = 0  # verdicts the stack's own check could not give (see the module's docstring)
    shard_undiagnosed: int = 0  # of the healthy ones counted on shards
    # What opened the fault, when it was not a rank's own end: "preflight" (the gang preflight
    # pinned nodes before the attempt trained; the fault spends no budget however it ends), or
    # "aws_notice" (a job with no control channel moved off a node AWS takes: no budget).
    opened_by: str = ""
    # The stop times of the fault's first exits, earliest first (``domain.suspects``): a later
    # exit with no evidence of its own is coupled, its node not checked ...
    exits: tuple[float, ...] = ()
    # ... unless the checks find nothing: then the coupled nodes are checked too, ``total``
    # raised to count them.
    escalated: bool = False

    @classmethod
    def from_item(cls, raw: Mapping[str, Any] | None) -> FaultTally:
        raw = raw or {}
        total = raw.get("total")
        return cls(attempt=int(raw.get("attempt") or 0), decided=int(raw.get("decided") or 0),
                   fatal=int(raw.get("fatal") or 0), reboot=int(raw.get("reboot") or 0),
                   rebooting=int(raw.get("rebooting") or 0),
                   total=None if total is None else int(total), infra=int(raw.get("infra") or 0),
                   held=int(raw.get("held") or 0), undiagnosed=int(raw.get("undiagnosed") or 0),
                   opened_by=str(raw.get("opened_by") or ""),
                   exits=tuple(float(t) for t in raw.get("exits") or ()),
                   escalated=bool(raw.get("escalated")))

    def to_item(self) -> dict[str, Any]:
        item: dict[str, Any] = {"attempt": self.attempt, "decided": self.decided, "fatal": self.fatal,
                                "reboot": self.reboot, "rebooting": self.rebooting, "infra": self.infra,
                                "held": self.held}
        if self.total is not None:
            item["total"] = self.total
        if self.opened_by:
            item["opened_by"] = self.opened_by
        if self.exits:
            item["exits"] = list(self.exits)
        if self.escalated:
            item["escalated"] = True
        if self.undiagnosed:
            item["undiagnosed"] = self.undiagnosed
        return item

    @property
    def ranks_ended(self) -> bool:
        """Every rank of the attempt ended (the suspect count is final)."""
        return self.total is not None

    @property
    def decided_all(self) -> int:
        """Verdicts counted, on the job item and on the shards."""
        return self.decided + self.shard_decided

    @property
    def infra_all(self) -> int:
        return self.infra + self.shard_infra

    @property
    def unjudged(self) -> bool:
        """A suspect went undiagnosed and no check found a node bad: whose the fault was is not
        known, so it is no one's to pay."""
        return self.undiagnosed + self.shard_undiagnosed > 0 and not self.found

    @property
    def pending(self) -> int | None:
        """Suspects still waiting for a verdict (None: not known yet, ranks still ending)."""
        return None if self.total is None else max(0, self.total - self.decided_all)

    @property
    def found(self) -> bool:
        """A check of the fault found it: a node is unusable, or needs a reboot."""
        return self.fatal > 0 or self.reboot > 0

    @property
    def all_decided(self) -> bool:
        return self.total is not None and self.decided_all >= self.total

    def with_verdict(self, label: SuspectVerdict, *, waits_for_reboot: bool = False,
                     held: bool = False) -> FaultTally:
        return replace(self, decided=self.decided + 1,
                       fatal=self.fatal + (1 if label in FATAL_SUSPECT_VERDICTS else 0),
                       reboot=self.reboot + (1 if label is SuspectVerdict.REBOOT else 0),
                       rebooting=self.rebooting + (1 if waits_for_reboot else 0),
                       held=self.held + (1 if held and label in FATAL_SUSPECT_VERDICTS else 0))

    def outcome(self, *, relocatable: bool) -> JobOutcome:
        """The job's fate from its verdicts so far (before its budget is looked at): an
        unusable node relocates the job (or fails it), a reboot restarts it once the node is
        back, all healthy restarts it without node action - once every verdict is in. A
        node whose reboot the breaker held back relocates the job too, or, for a job that
        cannot move, holds it until the breaker's reset (HOLD)."""
        if self.fatal > self.held:
            return JobOutcome.RELOCATE if relocatable else JobOutcome.FAIL_NODE_FAULT
        if self.held:
            return JobOutcome.RELOCATE if relocatable else JobOutcome.HOLD
        if self.reboot:
            return JobOutcome.RESTART_AFTER_REBOOT
        if not self.all_decided:
            return JobOutcome.WAIT
        return JobOutcome.RESTART
