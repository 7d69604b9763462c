"""Rank latches in DynamoDB (see ``gpu_recovery.domain.latch``): registered, ended, done.

An arrival is one UpdateItem on the rank's shard item (``ADD`` to number sets: idempotent,
no transaction, so thousands of ranks arriving at once never conflict), and, for the
arrival that completes a shard, one UpdateItem on the head item. A suspect node is
recorded on the shard in the same write as its rank's end, so once every rank ended the
suspects of the fault are final and can be counted (:meth:`suspect_nodes`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery.constants import JOB_PK, latch_head_key, latch_shard_key
from gpu_recovery.domain.latch import Latch, latch_complete, shard_complete, shard_count, shard_of
from gpu_recovery.repository.base import Update, from_ddb

PREFLIGHT_ADDRESSES = "pfa"  # "<rank>|<address>" of the ranks whose preflight loopback reported
COUPLED_NODES = "cpl"  # nodes whose rank's exit was coupled to the attempt's fault (domain.suspects)
REGISTERED_AT = "reg_at"  # the whole seconds the shard's ranks were registered at (at most 64 values)
ENDED_NODES = "end_nodes"  # the nodes of the shard's ranks that ended


@dataclass(frozen=True)
class Arrival:
    """Which latches of the attempt are complete after an arrival."""

    complete: frozenset[Latch] = field(default_factory=frozenset)

    def __contains__(self, latch: object) -> bool:
        return latch in self.complete


class LatchRepository:
    def __init__(self, base: Any) -> None:
        self.base = base  # Repository
        self.table = base.job_table_name

    def arrive(self, job_id: str, attempt: int, world_size: int, rank: int, latches: Iterable[Latch], *,
               suspect_node: str = "", coupled_node: str = "", node: str = "", address: str = "",
               registered_at: float | None = None) -> Arrival:
        """Rank ``rank`` of ``attempt`` arrives at ``latches`` (and names its node a suspect of
        the attempt's fault, or one whose exit was coupled to it; registering, records its
        ``node`` and the second it was ``registered_at``; ending, the ``node`` it leaves;
        reporting its preflight loopback, its ``address``, where its groups' peers reach it).
        Idempotent; returns the latches complete afterwards."""
        wanted = sorted(set(latches), key=lambda latch: latch.value)
        if not wanted and not suspect_node and not coupled_node:
            return Arrival()
        shard = shard_of(rank)
        adds: dict[str, set[Any]] = {latch.value: set[Any]([rank]) for latch in wanted}
        if suspect_node:
            adds["susp"] = {suspect_node}
        if coupled_node:
            adds[COUPLED_NODES] = {coupled_node}
        if node and Latch.REGISTERED in wanted:
            adds["nodes"] = {node}
        if node and Latch.ENDED in wanted:
            adds[ENDED_NODES] = {node}
        if registered_at and Latch.REGISTERED in wanted:
            adds[REGISTERED_AT] = {int(registered_at)}
        if address and Latch.PREFLIGHT in wanted:
            adds[PREFLIGHT_ADDRESSES] = {f"{rank}|{address}"}
        written = self.base.db.apply_returning(Update(
            table=self.table, key={JOB_PK: latch_shard_key(job_id, attempt, shard)},
            set_fields={"item_type": "LATCH"}, add_to_sets=adds), returning="ALL_NEW") or {}
        complete: set[Latch] = set()
        for latch in wanted:
            arrived = len(written.get(latch.value) or ())
            if not shard_complete(world_size, shard, arrived):
                continue
            head = self.base.db.apply_returning(Update(
                table=self.table, key={JOB_PK: latch_head_key(job_id, attempt)},
                set_fields={"item_type": "LATCH_HEAD"},
                add_to_sets={latch.head_attribute: {shard}}), returning="ALL_NEW") or {}
            if latch_complete(world_size, len(head.get(latch.head_attribute) or ())):
                complete.add(latch)
        return Arrival(frozenset(complete))

    def suspect_arrival(self, job_id: str, attempt: int, rank: int, node: str) -> Update:
        """``node`` named a suspect of the attempt's fault on ``rank``'s shard, as an update for
        a caller's transaction (``arrive`` with no latch, committed with the fault it names)."""
        [update] = self.suspect_arrivals(job_id, attempt, [(rank, node)])
        return update

    def suspect_arrivals(self, job_id: str, attempt: int, named: Iterable[tuple[int, str]]) -> list[Update]:
        """Each ``(rank, node)`` as :meth:`suspect_arrival`, one update per shard (a transaction
        writes an item once)."""
        shards: dict[int, set[str]] = {}
        for rank, node in named:
            shards.setdefault(shard_of(rank), set()).add(node)
        return [Update(table=self.table, key={JOB_PK: latch_shard_key(job_id, attempt, shard)},
                       set_fields={"item_type": "LATCH"}, add_to_sets={"susp": nodes})
                for shard, nodes in sorted(shards.items())]

    def complete(self, job_id: str, attempt: int, world_size: int) -> frozenset[Latch]:
        """The attempt's complete latches (one read: the head)."""
        head = self.base.db.get(self.table, {JOB_PK: latch_head_key(job_id, attempt)}) or {}
        head = from_ddb(head)
        return frozenset(latch for latch in Latch
                         if latch_complete(world_size, len(head.get(latch.head_attribute) or ())))

    def suspect_nodes(self, job_id: str, attempt: int, world_size: int) -> set[str]:
        """Every node named a suspect by a rank of the attempt (``ceil(n / 64)`` items, read
        once per fault, when every rank has ended)."""
        return self._union(job_id, attempt, world_size, "susp")

    def fault_nodes(self, job_id: str, attempt: int, world_size: int) -> tuple[set[str], set[str]]:
        """The attempt's suspect nodes and the nodes whose exits were coupled to its fault
        (``domain.suspects``) that are not suspects: one read of the shards."""
        items = self._shard_items(job_id, attempt, range(shard_count(world_size)))
        suspects = _members(items, "susp")
        return suspects, _members(items, COUPLED_NODES) - suspects

    def job_nodes(self, job_id: str, attempt: int, world_size: int) -> set[str]:
        """The nodes the attempt's ranks run on (read once per relocation): registered on, and
        named suspects or ended on (the rank's own node, in the same items: a registration whose
        arrival was lost still counts its node once the rank fails or ends)."""
        items = self._shard_items(job_id, attempt, range(shard_count(world_size)))
        return _members(items, "nodes") | _members(items, "susp") | _members(items, ENDED_NODES)

    def held_nodes(self, job_id: str, attempt: int, world_size: int) -> set[str]:
        """The nodes the attempt's ranks still hold, for a job with one rank per node (a queue
        job's gang): registered on and not ended on (``ceil(n / 64)`` items, whatever the job's
        size). A rank's end an older release recorded without its node leaves that node counted."""
        items = self._shard_items(job_id, attempt, range(shard_count(world_size)))
        return _members(items, "nodes") - _members(items, ENDED_NODES)

    def _union(self, job_id: str, attempt: int, world_size: int, attribute: str) -> set[str]:
        return _members(self._shard_items(job_id, attempt, range(shard_count(world_size))), attribute)

    def _shard_items(self, job_id: str, attempt: int, shards: Iterable[int]) -> list[dict[str, Any]]:
        """The attempt's latch shards ``shards``, as stored (one BatchGetItem per 100)."""
        keys = [{JOB_PK: latch_shard_key(job_id, attempt, s)} for s in shards]
        return list(self.base.db.batch_get(self.table, keys)) if keys else []

    def last_registered_at(self, job_id: str, attempt: int, world_size: int) -> float | None:
        """When the attempt's last rank was registered (``ceil(n / 64)`` items, read once per
        restart, only when its confirmation came late: a batch a broken call held back)."""
        times = [float(t) for item in self._shard_items(job_id, attempt, range(shard_count(world_size)))
                 for t in from_ddb(item).get(REGISTERED_AT) or ()]
        return max(times) if times else None

    def registered(self, job_id: str, attempt: int, world_size: int) -> set[int]:
        """The attempt's registered ranks (``ceil(n / 64)`` items: only when some are missing)."""
        items = self._shard_items(job_id, attempt, range(shard_count(world_size)))
        return _ranks(map(from_ddb, items), Latch.REGISTERED.value)

    def registered_not_ended(self, job_id: str, attempt: int, world_size: int) -> set[int]:
        """The attempt's ranks registered and not ended yet (``ceil(n / 64)`` items)."""
        items = [from_ddb(i) for i in self._shard_items(job_id, attempt, range(shard_count(world_size)))]
        return _ranks(items, Latch.REGISTERED.value) - _ranks(items, Latch.ENDED.value)

    def ends_settled(self, job_id: str, attempt: int, world_size: int) -> bool:
        """Every rank of the attempt registered has ended, and each shard those ends completed is
        on the head (an arrival that died before the head's write left its shard's ends
        uncounted): one BatchGetItem of the shards and the head."""
        shards, on_head = self._shards_and_head(job_id, attempt, range(shard_count(world_size)), Latch.ENDED)
        ended = _ranks(shards, Latch.ENDED.value)
        return _ranks(shards, Latch.REGISTERED.value) <= ended \
            and _final(shards, on_head, Latch.ENDED, world_size) == ended

    def addresses(self, job_id: str, attempt: int, ranks: Iterable[int]) -> dict[int, str]:
        """The preflight addresses ``ranks`` (a few group leaders) reported, by rank."""
        wanted = set(ranks)
        found: dict[int, str] = {}
        for item in self._shard_items(job_id, attempt, sorted({shard_of(r) for r in wanted})):
            for entry in item.get(PREFLIGHT_ADDRESSES) or ():
                rank, _, address = str(entry).partition("|")
                if rank.isdigit() and int(rank) in wanted:
                    found[int(rank)] = address
        return found

    def counted(self, job_id: str, attempt: int, world_size: int, ranks: Iterable[int],
                latch: Latch) -> set[int]:
        """Which of ``ranks`` (of one or a few shards) arrived at ``latch`` for good: on their
        shard, and that shard, once complete, on the head. The arrival that completed a shard
        and died before the head's write counted none of its ranks: nothing else completes the
        latch (one BatchGetItem: the shards and the head)."""
        wanted = set(ranks)
        shards, on_head = self._shards_and_head(job_id, attempt, sorted({shard_of(r) for r in wanted}), latch)
        return _final(shards, on_head, latch, world_size) & wanted

    def _shards_and_head(self, job_id: str, attempt: int, shards: Iterable[int],
                         latch: Latch) -> tuple[list[dict[str, Any]], set[int]]:
        """The shards ``shards`` (decoded) and the shards whose ``latch`` the head counts (one
        BatchGetItem)."""
        head_key = latch_head_key(job_id, attempt)
        keys = [{JOB_PK: latch_shard_key(job_id, attempt, s)} for s in shards]
        items = [from_ddb(i) for i in self.base.db.batch_get(self.table, [*keys, {JOB_PK: head_key}])]
        head: dict[str, Any] = next((i for i in items if i.get(JOB_PK) == head_key), {})
        return [i for i in items if i is not head], {int(s) for s in head.get(latch.head_attribute) or ()}

    def arrived(self, job_id: str, attempt: int, ranks: Iterable[int], latch: Latch) -> set[int]:
        """Which of ``ranks`` (of one or a few shards) arrived at ``latch``."""
        wanted = set(ranks)
        items = self._shard_items(job_id, attempt, sorted({shard_of(r) for r in wanted}))
        return _ranks(map(from_ddb, items), latch.value) & wanted


def _ranks(items: Iterable[dict[str, Any]], attribute: str) -> set[int]:
    """The union of a rank-set attribute over the (decoded) shard items."""
    return {int(r) for item in items for r in item.get(attribute) or ()}


def _final(shards: Iterable[dict[str, Any]], on_head: set[int], latch: Latch, world_size: int) -> set[int]:
    """The ranks at ``latch`` on shards whose count is final: a shard not complete, or complete
    and counted on the head (the arrival that completed it may have died before the head's write)."""
    final: set[int] = set()
    for item in shards:
        members = _ranks([item], latch.value)
        if members and (shard_of(min(members)) in on_head
                        or not shard_complete(world_size, shard_of(min(members)), len(members))):
            final |= members
    return final


def _members(items: Iterable[dict[str, Any]], attribute: str) -> set[str]:
    """The union of a string-set attribute over the shard items."""
    return {str(n) for item in items for n in item.get(attribute) or ()}
