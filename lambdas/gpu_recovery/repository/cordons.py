"""Cordons of known-bad nodes (``domain.cordon``): intents on the instance item, and the
worklist of ECS attribute syncs.

A cordon (or its removal) is an intent committed before any ECS call: the instance item's
``cordon`` (absent once uncordoned) and ``cordon_version`` (the intent's time), and, in the
same transaction, a member ``<node>#<version>`` added to one string set
(``CORDON#ecs-attribute-sync``). The ECS call (PutAttributes / DeleteAttributes, both
idempotent) syncs what the instance item says *now*; its confirmation removes the members
up to the version it synced, so a newer intent committed meanwhile stays in the worklist
and is synced again. The sweep reads the one worklist item every minute.

The same item keeps the *holds* (``domain.placement``): the spare and reserved nodes,
``holds`` (node -> {"why", "job", "arn", "at"}) with a revision ``holds_rev`` and the time of
its last change ``holds_at``. A change of holds is one conditional write (on the revision)
that also adds the changed nodes' worklist members, so their attribute follows through the
same sync; a sync's confirmation is conditional on the revision it read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery.constants import CORDON_SYNC_ITEM_KEY, INSTANCE_PK
from gpu_recovery.domain.cordon import ECS_APPLIED, ECS_HELD, ECS_PENDING, parse_sync_entry, sync_entry
from gpu_recovery.repository.base import Update, from_ddb

_SET = "pending"
_HOLDS, _REV, _AT = "holds", "holds_rev", "holds_at"
_REFUSED = "attribute_refused"  # members whose attribute ECS refused (reported once each)


@dataclass(frozen=True)
class Worklist:
    """The sync worklist item as read: pending members by node, the holds, their revision."""

    pending: dict[str, list[str]] = field(default_factory=dict)
    holds: dict[str, dict[str, Any]] = field(default_factory=dict)
    rev: int = 0
    holds_at: float = 0.0
    refused: frozenset[str] = frozenset()  # members whose attribute ECS refused, reported


class CordonRepository:
    def __init__(self, base: Any) -> None:
        self.base = base  # Repository
        self.table = base.instance_table_name

    # ----------------------------------------------------------- building blocks
    @staticmethod
    def cordon_fields(record: Mapping[str, Any], version: float) -> dict[str, Any]:
        """Instance fields that cordon the node (with :meth:`sync_update` of ``version``)."""
        return {"cordon": dict(record), "cordon_version": version}

    def sync_update(self, node: str, version: float) -> Update:
        """The worklist member of an intent (ADD: idempotent, no condition)."""
        return Update(table=self.table, key={INSTANCE_PK: CORDON_SYNC_ITEM_KEY},
                      set_fields={"item_type": "CORDON_SYNC"},
                      add_to_sets={_SET: {sync_entry(node, version)}})

    def uncordon_updates(self, node: str, version: float) -> tuple[dict[str, Any], list[str], Update]:
        """(fields to set, fields to remove, worklist update) that uncordon the node."""
        return {"cordon_version": version}, ["cordon"], self.sync_update(node, version)

    # --------------------------------------------------------------------- reads
    def pending(self) -> dict[str, list[str]]:
        """node -> its worklist members (one GetItem)."""
        return self.worklist().pending

    def worklist(self) -> Worklist:
        """Pending members, holds and their revision (one GetItem)."""
        item = self.base.db.get(self.table, {INSTANCE_PK: CORDON_SYNC_ITEM_KEY}) or {}
        out: dict[str, list[str]] = {}
        for member in item.get(_SET) or ():
            parsed = parse_sync_entry(str(member))
            if parsed is not None:
                out.setdefault(parsed[0], []).append(str(member))
        holds = {str(n): from_ddb(dict(h)) for n, h in (item.get(_HOLDS) or {}).items()
                 if isinstance(h, Mapping)}
        return Worklist(out, holds, int(item.get(_REV) or 0), float(item.get(_AT) or 0.0),
                        frozenset(str(m) for m in item.get(_REFUSED) or ()))

    def refused_update(self, members: Iterable[str]) -> Update:
        """``members``' attribute was refused by ECS (no room on the node): reported once,
        still pending (the sweep tries again); forgotten with them once synced."""
        return Update(table=self.table, key={INSTANCE_PK: CORDON_SYNC_ITEM_KEY},
                      add_to_sets={_REFUSED: set(members)})

    def set_holds(self, read: Worklist, changes: Mapping[str, Mapping[str, Any] | None], now: float) -> bool:
        """Apply ``changes`` (node -> new hold, None: released) to the holds read, with the
        changed nodes' worklist members; only if no other change landed since ``read``."""
        if not changes:
            return True
        holds = {n: dict(h) for n, h in read.holds.items()}
        for node, hold in changes.items():
            if hold is None:
                holds.pop(node, None)
            else:
                holds[node] = {**hold, "at": now}
        condition = "attribute_not_exists(#rev)" if read.rev == 0 else "#rev = :rev"
        return self.base.db.apply(Update(
            table=self.table, key={INSTANCE_PK: CORDON_SYNC_ITEM_KEY},
            set_fields={"item_type": "CORDON_SYNC", _HOLDS: holds, _REV: read.rev + 1, _AT: now},
            add_to_sets={_SET: {sync_entry(node, now) for node in changes}},
            condition=condition, condition_names={"#rev": _REV},
            condition_values={":rev": read.rev} if read.rev else {}))

    # ------------------------------------------------------------------- intents
    def confirm_synced(self, node: str, version: float | None, members: Iterable[str], *,
                       applied: bool, read: Worklist | None = None) -> bool:
        """The attribute matches the intent of ``version``: mark a cordon applied (only if no
        newer intent landed) and remove the members up to that version. With the holds
        ``read`` the sync used: members up to their last change too, only if they did not
        change since (else the sweep syncs again)."""
        if applied and version is not None:
            self.base.db.apply(self.base.instance_update(
                node, set_fields={"cordon.ecs": ECS_APPLIED},
                extra_condition="attribute_exists(#c) AND #cv = :cv",
                extra_values={":cv": version}, extra_names={"#c": "cordon", "#cv": "cordon_version"}))
        synced = version
        if read is not None and read.holds_at:
            synced = max(version or 0.0, read.holds_at)
        done = {m for m in members
                if (parsed := parse_sync_entry(m)) is not None
                and (synced is None or parsed[1] <= synced)}
        if not done:
            return False
        gone = {_SET: done}
        if read is not None and done & read.refused:
            gone[_REFUSED] = done & read.refused
        update = Update(table=self.table, key={INSTANCE_PK: CORDON_SYNC_ITEM_KEY},
                        delete_from_sets=gone)
        if read is not None:
            update.condition = "attribute_not_exists(#rev)" if read.rev == 0 else "#rev = :rev"
            update.condition_names = {"#rev": _REV}
            update.condition_values = {":rev": read.rev} if read.rev else {}
        return self.base.db.apply(update)

    def confirm_holds_synced(self, members: Iterable[str], read: Worklist) -> bool:
        """The attributes of nodes without a cordon match the holds ``read``: their members
        up to the holds' last change removed, only if the holds did not change since (else
        the sweep syncs again). One write for any number of nodes."""
        done = {m for m in members
                if (parsed := parse_sync_entry(m)) is not None and parsed[1] <= read.holds_at}
        if not done:
            return False
        update = Update(table=self.table, key={INSTANCE_PK: CORDON_SYNC_ITEM_KEY},
                        delete_from_sets={_SET: done},
                        condition="attribute_not_exists(#rev)" if read.rev == 0 else "#rev = :rev",
                        condition_names={"#rev": _REV},
                        condition_values={":rev": read.rev} if read.rev else {})
        return self.base.db.apply(update)

    def drop(self, members: Iterable[str]) -> bool:
        """Members with nothing to sync (the node is unknown to the loop)."""
        members = set(members)
        if not members:
            return False
        return self.base.db.apply(Update(table=self.table, key={INSTANCE_PK: CORDON_SYNC_ITEM_KEY},
                                         delete_from_sets={_SET: members}))

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
