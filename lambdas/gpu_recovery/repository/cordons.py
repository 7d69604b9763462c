"""Cordons of known-bad nodes (``domain.cordon``): intents on the instance item, and the
worklist of ECS attribute syncs.

A cordon (or its removal) is an intent committed before any ECS call: the instance item's
``cordon`` (absent once uncordoned) and ``cordon_version`` (the intent's time), and, in the
same transaction, a member ``<node>#<version>`` added to one string set
(``CORDON#ecs-attribute-sync``, split over ``CORDON_SYNC_SHARDS`` items by the node: the
node's shard). The ECS call (PutAttributes / DeleteAttributes, both idempotent) syncs what
the instance item says *now*; its confirmation removes the members up to the version it
synced, so a newer intent committed meanwhile stays in the worklist and is synced again.
The worklist is read whole, every shard, in one BatchGetItem (the sweep every minute).

The same items keep the *holds* (``domain.placement``): the spare and reserved nodes,
``holds`` (node -> {"why", "job", "arn", "at"}) of the shard's nodes, with the shard's
revision ``holds_rev`` and the time of its last change ``holds_at``. A change of holds is a
conditional write (on the revision) of each shard it touches, all in one transaction, that
also adds the changed nodes' worklist members, so their attribute follows through the same
sync; a sync's confirmation is conditional on the revision of the shard it read. A job's
reservation also notes who puts it, ``syncing`` (job -> the commit's time, pruned after
``SYNC_LEASE_SECONDS``): others leave those nodes to that invocation until it is done or gives up.

Why shards: one item was written by every suspect node's transaction of a large fault and
held every node's hold, so it took an item's 1,000 WCU/s and grew with the cluster (130 KB
at 1,024 nodes); split by a stable hash of the node, each shard takes a sixteenth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery.constants import CORDON_SYNC_ITEM_KEY, CORDON_SYNC_SHARDS, INSTANCE_PK
from gpu_recovery.domain.cordon import ECS_APPLIED, ECS_HELD, ECS_PENDING, parse_sync_entry, sync_entry
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.placement import SYNC_LEASE_SECONDS
from gpu_recovery.domain.shards import stable_shard
from gpu_recovery.repository.base import Update, from_ddb
from gpu_recovery.repository.records import instance_from_item

_SET = "pending"
_HOLDS, _REV, _AT = "holds", "holds_rev", "holds_at"
_REFUSED = "attribute_refused"  # members whose attribute ECS refused (reported once each)
_SYNCING = "syncing"  # job -> its reservation's commit time, while its committer puts it


def cordon_sync_item_key(shard: int) -> str:
    """The worklist item of ``shard`` (shard 0 keeps the unsharded item's key)."""
    return CORDON_SYNC_ITEM_KEY if shard == 0 else f"{CORDON_SYNC_ITEM_KEY}#{shard:02d}"


_SHARD_OF_KEY = {cordon_sync_item_key(s): s for s in range(CORDON_SYNC_SHARDS)}


def shard_of(node: str) -> int:
    """The worklist shard of ``node`` (the same in every process and release)."""
    return stable_shard(node, CORDON_SYNC_SHARDS)


@dataclass(frozen=True)
class Worklist:
    """The sync worklist as read (every shard): pending members by node, the holds, and each
    shard's revision and last change of its holds."""

    pending: dict[str, list[str]] = field(default_factory=dict)
    holds: dict[str, dict[str, Any]] = field(default_factory=dict)
    revs: dict[int, int] = field(default_factory=dict)  # shard -> holds_rev as read (0: none)
    holds_ats: dict[int, float] = field(default_factory=dict)  # shard -> holds_at as read
    refused: frozenset[str] = frozenset()  # members whose attribute ECS refused, reported
    where: dict[str, int] = field(default_factory=dict)  # member -> the shard it was read from
    syncing: dict[int, dict[str, float]] = field(default_factory=dict)  # shard -> job -> commit time

    def shard_holds(self, shard: int) -> dict[str, dict[str, Any]]:
        return {n: dict(h) for n, h in self.holds.items() if shard_of(n) == shard}

    def being_put(self, job_id: str, now: float, node: str = "") -> bool:
        """``job_id``'s reservation is still put by the invocation that committed it (its note
        within ``SYNC_LEASE_SECONDS`` of the commit; none once its committer gave it back), and
        ``node``, if given, is among its holds."""
        times = [at for shard in self.syncing.values() if (at := shard.get(job_id)) is not None]
        return bool(times) and now - max(times) < SYNC_LEASE_SECONDS \
            and (not node or (self.holds.get(node) or {}).get("job") == job_id)


class CordonRepository:
    def __init__(self, base: Any) -> None:
        self.base = base  # Repository
        self.table = base.instance_table_name

    def _key(self, shard: int) -> dict[str, Any]:
        return {INSTANCE_PK: cordon_sync_item_key(shard)}

    @staticmethod
    def _on_rev(update: Update, read: Worklist, shard: int) -> Update:
        """``update`` only if the shard's holds did not change since ``read``."""
        rev = read.revs.get(shard, 0)
        update.condition = "attribute_not_exists(#rev)" if rev == 0 else "#rev = :rev"
        update.condition_names = {"#rev": _REV}
        update.condition_values = {":rev": rev} if rev else {}
        return update

    # ----------------------------------------------------------- building blocks
    @staticmethod
    def cordon_fields(record: Mapping[str, Any], version: float) -> dict[str, Any]:
        """Instance fields that cordon the node (with :meth:`sync_update` of ``version``)."""
        return {"cordon": dict(record), "cordon_version": version}

    def sync_update(self, node: str, version: float) -> Update:
        """The worklist member of an intent, on the node's shard (ADD: idempotent, no condition)."""
        return Update(table=self.table, key=self._key(shard_of(node)),
                      set_fields={"item_type": "CORDON_SYNC"},
                      add_to_sets={_SET: {sync_entry(node, version)}})

    def uncordon_updates(self, node: str, version: float) -> tuple[dict[str, Any], list[str], Update]:
        """(fields to set, fields to remove, worklist update) that uncordon the node."""
        return {"cordon_version": version}, ["cordon"], self.sync_update(node, version)

    def end_with_its_cordon(self, node: str, now: float, end: Callable[[dict[str, Any], list[str]], Update],
                            owner: tuple[str, Any]) -> bool:
        """What put the node's cordon ends, and takes the cordon with it only if the cordon is
        its own (``cordon.<owner[0]> = owner[1]``), with the attribute's worklist member, in one
        transaction. ``end(fields, removed)``: the ending update, given what uncordons."""
        fields, gone, sync = self.uncordon_updates(node, now)
        update = end(fields, gone)
        update.condition = f"({update.condition}) AND #c.#co = :co"
        update.condition_names.update({"#c": "cordon", "#co": owner[0]})
        update.condition_values[":co"] = owner[1]
        return bool(self.base.db.transact([update, sync]))

    # --------------------------------------------------------------------- reads
    def pending(self) -> dict[str, list[str]]:
        """node -> its worklist members (one BatchGetItem)."""
        return self.worklist().pending

    def worklist(self) -> Worklist:
        """Pending members, holds and each shard's revision (one BatchGetItem of the shards)."""
        return worklist_from(self.base.db.batch_get(self.table, self.worklist_keys()))

    def worklist_of(self, node: str) -> Worklist:
        """The worklist as ``node``'s shard alone says it (one GetItem)."""
        item = self.base.db.get(self.table, self._key(shard_of(node)))
        return worklist_from([item] if item else [])

    def instances_and_holds(self, nodes: Iterable[str]
                            ) -> tuple[dict[str, Instance], dict[str, dict[str, Any]]]:
        """``nodes``' records and their placement holds, in one BatchGetItem: their instance
        items with the worklist shards their holds are on (one per node at most)."""
        wanted = set(nodes)
        shard_keys = [self._key(s) for s in sorted({shard_of(n) for n in wanted})]
        shards = {str(k[INSTANCE_PK]) for k in shard_keys}
        items = self.base.db.batch_get(self.table, [*({INSTANCE_PK: n} for n in sorted(wanted)), *shard_keys])
        holds = worklist_from(items).holds
        found = (instance_from_item(i) for i in items if str(i.get(INSTANCE_PK)) not in shards)
        return ({inst.container_inst_id: inst for inst in found},
                {n: h for n, h in holds.items() if n in wanted})

    def worklist_keys(self) -> list[dict[str, Any]]:
        """The worklist's shards' keys (on the instance table)."""
        return [self._key(s) for s in range(CORDON_SYNC_SHARDS)]

    def _by_shard(self, members: Iterable[str], read: Worklist | None = None) -> dict[int, set[str]]:
        """``members`` grouped by the shard they were read from (else their node's)."""
        grouped: dict[int, set[str]] = {}
        for member in members:
            parsed = parse_sync_entry(member)
            if parsed is None:
                continue
            shard = read.where.get(member) if read is not None else None
            grouped.setdefault(shard_of(parsed[0]) if shard is None else shard, set()).add(member)
        return grouped

    def record_refused(self, members: Iterable[str], also: Sequence[Update] = ()) -> bool:
        """``members``' attribute was refused by ECS (no room on the node): reported once (the
        e-mail owed, ``also``, in the same transaction), still pending (the sweep tries again);
        forgotten with them once synced."""
        return self.base.db.transact([
            *(Update(table=self.table, key=self._key(shard), add_to_sets={_REFUSED: found})
              for shard, found in sorted(self._by_shard(members).items())), *also])

    def set_holds(self, read: Worklist, changes: Mapping[str, Mapping[str, Any] | None], now: float,
                  syncing_for: str = "") -> bool:
        """Apply ``changes`` (node -> new hold, None: released) to the holds read, with the
        changed nodes' worklist members; only if no other change landed since ``read`` on the
        shards they touch (all of them or none: one transaction). ``syncing_for``: the job whose
        reservation this is, put by the caller (``Worklist.being_put``)."""
        if not changes:
            return True
        by_shard: dict[int, dict[str, Mapping[str, Any] | None]] = {}
        for node, hold in changes.items():
            by_shard.setdefault(shard_of(node), {})[node] = hold
        updates = []
        for shard, shard_changes in sorted(by_shard.items()):
            holds = read.shard_holds(shard)
            for node, hold in shard_changes.items():
                if hold is None:
                    holds.pop(node, None)
                else:
                    holds[node] = {**hold, "at": now}
            syncing = {j: at for j, at in read.syncing.get(shard, {}).items()
                       if now - at < SYNC_LEASE_SECONDS and j != syncing_for}
            if syncing_for:
                syncing[syncing_for] = now
            updates.append(self._on_rev(Update(
                table=self.table, key=self._key(shard),
                set_fields={"item_type": "CORDON_SYNC", _HOLDS: holds, _REV: read.revs.get(shard, 0) + 1,
                            _AT: now, _SYNCING: syncing},
                add_to_sets={_SET: {sync_entry(node, now) for node in shard_changes}}), read, shard))
        return self.base.db.transact(updates)

    def stop_syncing(self, job_id: str, at: float) -> bool:
        """``job_id``'s reservation committed at ``at`` is no longer put by its committer (it
        gave up): others put it now. One conditional write per shard it is on (a shard
        changed since this read keeps it until its lease ends)."""
        read = self.worklist()
        updates = []
        for shard, syncing in sorted(read.syncing.items()):
            if abs(syncing.get(job_id, -1.0) - at) < 1e-3:
                rest = {j: t for j, t in syncing.items() if j != job_id}
                updates.append(self._on_rev(Update(table=self.table, key=self._key(shard),
                                                   set_fields={_SYNCING: rest}), read, shard))
        return bool(updates) and self.base.db.transact(updates)

    # ------------------------------------------------------------------- intents
    def confirm_synced(self, node: str, version: float | None, members: Iterable[str], *,
                       applied: bool, read: Worklist | None = None) -> bool:
        """The attribute matches the intent of ``version``: mark a cordon applied (only if no
        newer intent landed) and remove the members up to that version. With the holds
        ``read`` the sync used: members up to their shard's last change of holds too, only if
        they did not change since (else the sweep syncs again)."""
        if applied and version is not None:
            self.base.db.apply(self.base.instance_update(
                node, set_fields={"cordon.ecs": ECS_APPLIED},
                extra_condition="attribute_exists(#c) AND #cv = :cv",
                extra_values={":cv": version}, extra_names={"#c": "cordon", "#cv": "cordon_version"}))
        synced = version
        holds_at = read.holds_ats.get(shard_of(node), 0.0) if read is not None else 0.0
        if holds_at:
            synced = max(version or 0.0, holds_at)
        done = {m for m in members
                if (parsed := parse_sync_entry(m)) is not None
                and (synced is None or parsed[1] <= synced)}
        if not done:
            return False
        updates = []
        for shard, found in sorted(self._by_shard(done, read).items()):
            gone = {_SET: found}
            if read is not None and found & read.refused:
                gone[_REFUSED] = found & read.refused
            update = Update(table=self.table, key=self._key(shard), delete_from_sets=gone)
            updates.append(self._on_rev(update, read, shard) if read is not None else update)
        return self.base.db.transact(updates)

    def confirm_holds_synced(self, members: Iterable[str], read: Worklist) -> bool:
        """The attributes of nodes without a cordon match the holds ``read``: their members
        up to their shard's last change of holds removed, only if those holds did not change
        since (else the sweep syncs again). One write for any number of nodes."""
        updates = []
        for shard, found in sorted(self._by_shard(members, read).items()):
            at = read.holds_ats.get(shard, 0.0)
            done = {m for m in found if (parsed := parse_sync_entry(m)) is not None and parsed[1] <= at}
            if done:
                updates.append(self._on_rev(Update(table=self.table, key=self._key(shard),
                                                   delete_from_sets={_SET: done}), read, shard))
        return bool(updates) and self.base.db.transact(updates)

    def drop(self, members: Iterable[str]) -> bool:
        """Members with nothing to sync (the node is unknown to the loop)."""
        updates = [Update(table=self.table, key=self._key(shard), delete_from_sets={_SET: found})
                   for shard, found in sorted(self._by_shard(members).items())]
        return bool(updates) and self.base.db.transact(updates)

    def admit_held(self, node: str, version: float, breaker: Update | None) -> bool:
        """A held cordon may now be put in ECS: ``cordon.ecs`` held -> pending (only for the
        intent read) with the cordon limit's new state (conditional on its version)."""
        update = self.base.instance_update(
            node, set_fields={"cordon.ecs": ECS_PENDING},
            extra_condition="#c.#e = :held AND #cv = :cv",
            extra_values={":held": ECS_HELD, ":cv": version},
            extra_names={"#c": "cordon", "#e": "ecs", "#cv": "cordon_version"})
        return self.base.db.transact([update, *([breaker] if breaker is not None else [])])

    def cordon(self, node: str, record: Mapping[str, Any], version: float,
               breaker: Update | None = None, also: Sequence[Update] = ()) -> bool:
        """Cordon a node the loop knows (no state change), with the limit's state (``also``:
        the e-mail it owes)."""
        update = self.base.instance_update(
            node, set_fields=self.cordon_fields(record, version),
            extra_condition="attribute_exists(#k)", extra_names={"#k": INSTANCE_PK})
        return self.base.db.transact([update, self.sync_update(node, version),
                                      *([breaker] if breaker is not None else []), *also])

    def uncordon(self, node: str, version: float) -> bool:
        """The operator's uncordon (or any clearing without a state change): only a cordoned
        node; DeleteAttributes follows through the worklist."""
        fields, remove, sync = self.uncordon_updates(node, version)
        update = self.base.instance_update(
            node, set_fields=fields, remove_fields=[*remove, "suspect_fence"],
            extra_condition="attribute_exists(#c)", extra_names={"#c": "cordon"})
        return self.base.db.transact([update, sync])


def worklist_from(items: Iterable[Mapping[str, Any]]) -> Worklist:
    """The worklist from its shards' items (another item read with them is left out)."""
    out: dict[str, list[str]] = {}
    holds: dict[str, dict[str, Any]] = {}
    revs: dict[int, int] = {}
    ats: dict[int, float] = {}
    refused: set[str] = set()
    where: dict[str, int] = {}
    syncing: dict[int, dict[str, float]] = {}
    for item in sorted(items, key=lambda i: _SHARD_OF_KEY.get(str(i.get(INSTANCE_PK)), 0)):
        shard = _SHARD_OF_KEY.get(str(item.get(INSTANCE_PK)))
        if shard is None:
            continue
        for member in item.get(_SET) or ():
            parsed = parse_sync_entry(str(member))
            if parsed is not None:
                out.setdefault(parsed[0], []).append(str(member))
                where[str(member)] = shard
        holds.update({str(n): from_ddb(dict(h)) for n, h in (item.get(_HOLDS) or {}).items()
                      if isinstance(h, Mapping)})
        revs[shard] = int(item.get(_REV) or 0)
        ats[shard] = float(item.get(_AT) or 0.0)
        refused |= {str(m) for m in item.get(_REFUSED) or ()}
        syncing[shard] = {str(j): float(at) for j, at in (item.get(_SYNCING) or {}).items()}
    return Worklist(out, holds, revs, ats, frozenset(refused), where, syncing)
