"""Cordons and holds: the ECS attributes that keep other schedulers off known-bad, spare
and reserved nodes (``domain.placement``).

The decision to cordon (or uncordon) a node is committed with the node decision that
found it bad (or healthy again) — see ``domain.cordon`` and ``repository.cordons``. Here:
the ECS side, carried out after the commit and finished by the sweep (the worklist):

* :meth:`Cordons.sync` puts or deletes ``gpu-recovery.unavailable`` (and the deprecated
  ``gpu-recovery.cordoned``) as the instance item and the node's hold say *now*
  (PutAttributes / DeleteAttributes are idempotent), then confirms; the holds (spare,
  reserved) are changed by ``recovery.placement`` and follow the same worklist;
* a cordon held by the cordon limit (``ecs: held``) is put once the operator reset the
  breaker and the limit's window has room; until then the node stays out of the queue's
  placements and relocation, and the operator was told (:meth:`limit_tripped_notice`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from functools import partial
from typing import Any, Protocol

from gpu_recovery import clock
from gpu_recovery.adapters.ecs import AttributeLimitExceeded
from gpu_recovery.constants import NotificationKind
from gpu_recovery.domain import cordon as policy
from gpu_recovery.domain import placement
from gpu_recovery.domain.models import Instance
from gpu_recovery.once_more import twice
from gpu_recovery.recovery.breaker.gate import NodeActionGate
from gpu_recovery.recovery.notices import Notices, Owed
from gpu_recovery.recovery.ports import MetricsPort
from gpu_recovery.recovery.reactions import HoldsDue, Reactions
from gpu_recovery.repository.cordons import CordonRepository, Worklist

logger = logging.getLogger(__name__)


#: what the holds' refresh answers when it wrote nothing (the worklist read before it stands)
UNCHANGED_HOLDS = frozenset({"no_holds", "holds_unchanged"})
# A batched sync confirms its nodes this many at a time (10 attribute calls of 10 nodes).
CONFIRM_EVERY_NODES = 100


class CordonData(Protocol):
    """The cordon worklist and its syncs (``repository/cordons.py``), the nodes' records."""

    cordons: CordonRepository

    def get_instance(self, container_inst_id: str) -> Instance | None: ...
    def get_instances(self, ids: Iterable[str]) -> dict[str, Instance]: ...


class NodeAttributes(Protocol):
    """PutAttributes and DeleteAttributes on container instances (one, or many a call)."""

    def put_attributes(self, container_instance: str, attributes: Mapping[str, str]) -> bool: ...
    def delete_attributes(self, container_instance: str, names: Sequence[str]) -> bool: ...
    def put_attributes_many(self, entries: Sequence[tuple[str, str, str]]) -> set[str]: ...
    def delete_attributes_many(self, entries: Sequence[tuple[str, str]]) -> set[str]: ...


@dataclass(eq=False, repr=False)
class Cordons:
    data: CordonData
    ecs: NodeAttributes
    notices: Notices
    gate: NodeActionGate  # the breaker item (the cordon limit's state)
    _: KW_ONLY
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    # Told: the sweep starts (the spare and reserved holds refreshed first, on its read of
    # the worklist; answers what was done).
    reactions: Reactions = field(default_factory=Reactions)

    # --------------------------------------------------------------------- sync
    def sync(self, node: str, members: list[str] | None = None, read: Worklist | None = None) -> str:
        """Make the node's ECS attributes match its instance item (cordon) and its hold
        (spare, reserved): ``gpu-recovery.unavailable`` with its value, and the deprecated
        ``gpu-recovery.cordoned`` on a cordoned node; confirm. Returns what was done."""
        repo = self.data
        read = read or repo.cordons.worklist()
        if members is None:
            members = read.pending.get(node, [])
        if not members:
            return "nothing_to_sync"
        instance = repo.get_instance(node)
        hold = read.holds.get(node)
        if instance is not None and instance.cordoned and instance.cordon.get("ecs") == policy.ECS_HELD:
            if not self._admit_held(instance):
                return "cordon_held"  # its members stay: tried again every minute
            instance = repo.get_instance(node) or instance
        cordon = instance.cordon if instance is not None else None
        if instance is not None:
            target = instance.container_instance_arn or instance.container_inst_id
        else:
            target = str((hold or {}).get("arn") or node)  # a released hold: the short id will do
        put, delete = placement.attributes_wanted(cordon, hold)
        if instance is None or instance.cordon_version is None:
            # Never cordoned: no deprecated attribute to take off (one call, not two).
            delete = [d for d in delete if d != placement.DEPRECATED_CORDON_ATTRIBUTE]
        known = True
        try:
            if put:
                known = self.ecs.put_attributes(target, put)
            if delete and known:
                known = self.ecs.delete_attributes(target, delete)
        except AttributeLimitExceeded:
            return self._no_room(node, instance, members, read, put)
        value = put.get(placement.UNAVAILABLE_ATTRIBUTE)
        action = f"marked_{value}" if value else "unmarked"
        if value == placement.CORDONED:
            action = "cordoned"
        elif instance is not None and instance.cordon_version is not None and not instance.cordoned \
                and value is None:
            action = "uncordoned"
        if not known:
            action = "instance_gone"
        applied = bool(instance is not None and instance.cordoned and known
                       and value in (placement.CORDONED, placement.NOTICE))
        repo.cordons.confirm_synced(node, instance.cordon_version if instance is not None else None,
                                    members, applied=applied, read=read)
        logger.info("placement attributes synced", extra={
            "instance": node, "action": action,
            "version": instance.cordon_version if instance is not None else None})
        return action

    def _no_room(self, node: str, instance: Instance | None, members: list[str], read: Worklist,
                 put: dict[str, str]) -> str:
        """ECS refused the attribute: the node carries the 10 custom attributes a container
        instance takes, its users' own. Its members stay pending (each sweep tries again: the
        node takes the attribute once one of them is removed); the operator is told once per
        intent (the members reported are kept on the worklist item until synced)."""
        value = put.get(placement.UNAVAILABLE_ATTRIBUTE, "")
        logger.error("placement attribute refused: the node carries 10 custom ECS attributes", extra={
            "instance": node, "attribute": placement.UNAVAILABLE_ATTRIBUTE, "value": value})
        self.metrics.add_metric("PlacementAttributeRefused", "Count", 1)
        new = [m for m in members if m not in read.refused]
        if not new:
            return "attribute_limit"
        owed = self.notices.for_node(
            NotificationKind.OPERATOR_ACTION, "GPU node has no room for the placement attribute",
            container_inst_id=node, instance_id=instance.ec2_instance_id if instance is not None else "",
            what_happened=(f"ECS refused {placement.UNAVAILABLE_ATTRIBUTE}={value} on {node}: a container "
                           "instance takes at most 10 custom attributes, and this one carries 10 already"),
            what_was_done=("The stack's own scheduler and relocation keep off the node as decided, but "
                           "other schedulers (placement constraint on the attribute) may place tasks on "
                           "it; the attribute is tried again every minute"),
            operator_action=("Remove one of the node's own custom attributes (aws ecs list-attributes / "
                             "delete-attributes): the next sweep puts the stack's."))
        now = clock.now()
        if self.data.cordons.record_refused(new, also=self.notices.owe([owed], now)):
            self.notices.send([owed])
        return "attribute_limit"

    def sync_many(self, nodes: Iterable[str], read: Worklist | None = None) -> dict[str, str]:
        """:meth:`sync` of many nodes whose attribute follows their hold only (spare,
        reserved, none), in few calls: one BatchGetItem of their items, PutAttributes and
        DeleteAttributes of up to 10 nodes a call, one confirmation of the worklist (on the
        holds' revision read: a newer change is synced again). A node with a cordon, now or
        before (its deprecated attribute, its ``applied`` mark), is synced alone, after them.
        A step that fails leaves the others to be tried: the first failure is raised once
        every node was (one node's lost answer left a fault's other nodes unreserved until
        the sweep: soak seed 6998 at 6 %)."""
        repo = self.data
        # The reads, each taken again at once when it fails: a relocation's reservation whose
        # two tries both died before the put left its target unmarked for a minute, and a
        # user's scheduler placed a task there (soak seed 7254 at 10 %).
        read = read or twice(repo.cordons.worklist)
        todo = {n: read.pending[n] for n in sorted(set(nodes)) if read.pending.get(n)}
        if not todo:
            return {}
        instances = twice(partial(repo.get_instances, todo))
        done: dict[str, str] = {}
        puts: list[tuple[str, str, str]] = []
        deletes: list[tuple[str, str]] = []
        targets: dict[str, str] = {}
        alone: list[str] = []
        for node in todo:
            instance = instances.get(node)
            if instance is not None and (instance.cordoned or instance.cordon_version is not None):
                alone.append(node)
                continue
            hold = read.holds.get(node)
            target = (instance.container_instance_arn if instance is not None else "") \
                or str((hold or {}).get("arn") or node)
            targets[node] = target
            value = placement.attribute_value(None, hold)
            if value is None:
                deletes.append((target, placement.UNAVAILABLE_ATTRIBUTE))
            else:
                puts.append((target, placement.UNAVAILABLE_ATTRIBUTE, value))
            done[node] = f"marked_{value}" if value else "unmarked"
        batched = list(targets)
        failed: Exception | None = None
        try:
            # Confirmed a slice at a time: a sync of a thousand nodes (a large job's reservations)
            # that dies or is throttled half-way keeps what it did; the sweep's pass, one node a
            # call, is left only the rest.
            for start in range(0, len(batched), CONFIRM_EVERY_NODES):
                part = batched[start:start + CONFIRM_EVERY_NODES]
                wanted = {targets[n] for n in part}
                part_puts = [p for p in puts if p[0] in wanted]
                part_deletes = [d for d in deletes if d[0] in wanted]
                gone = self.ecs.put_attributes_many(part_puts) if part_puts else set()
                gone |= self.ecs.delete_attributes_many(part_deletes) if part_deletes else set()
                for node in part:
                    if targets[node] in gone:
                        done[node] = "instance_gone"
                members = [m for n in part for m in todo[n]]
                if members:
                    repo.cordons.confirm_holds_synced(members, read)
            if batched:
                logger.info("placement attributes synced", extra={"nodes": {n: done[n] for n in batched}})
        except Exception as error:
            failed = error
        for node in alone:
            try:
                done[node] = self.sync(node, todo[node], read)
            except Exception as error:
                failed = failed or error
        if failed is not None:
            raise failed
        return done

    def sync_many_quietly(self, nodes: Iterable[str], read: Worklist | None = None) -> dict[str, str]:
        """After a commit that changed holds: the sweep finishes it if this fails."""
        try:
            return self.sync_many(nodes, read)
        except Exception as error:  # the worklist keeps the intent
            logger.warning("placement attribute sync failed; the sweep retries it",
                           extra={"error": str(error)})
            return {}

    def sync_quietly(self, node: str) -> str:
        """Right after a commit that changed the cordon: the sweep finishes it if this fails."""
        try:
            return self.sync(node)
        except Exception as error:  # the worklist keeps the intent
            logger.warning("cordon sync failed; the sweep retries it",
                           extra={"instance": node, "error": str(error)})
            return "cordon_sync_failed"

    def _admit_held(self, instance: Instance) -> bool:
        """A held cordon: the limit's window has room again (after a reset)?"""
        answer = self.gate.decide(node=instance.container_inst_id, action=None, job_ids=(),
                                  reason="held cordon", now=clock.now(), cordon_unless_drained=True)
        if answer.cordon is None or not answer.cordon.allowed or instance.cordon_version is None:
            return False
        return bool(self.data.cordons.admit_held(instance.container_inst_id, instance.cordon_version,
                                                      answer.update))

    def sweep(self, read: Worklist | None = None, *, short_of_time: Callable[[], bool] | None = None,
              job_deadlines: Sequence[Mapping[str, Any]] | None = None) -> dict[str, int]:
        """Every minute: the holds brought up to date (``HoldsDue``: spares and reservations,
        ``recovery.placement``), then every node whose ECS attributes are not confirmed yet
        (``read``: the worklist as the caller just read it, else read here), one call each,
        until ``short_of_time()``: the rest is the next sweep's (a backlog of a thousand
        nodes, a large job's reservations whose batched sync failed, takes minutes of calls
        at the ECS budget's pace, and the sweep has other work). ``job_deadlines``: the job
        table's deadline index as the caller just read it, for the holds (else read there)."""
        done: dict[str, int] = {}
        read = read or self.data.cordons.worklist()
        if self.reactions.handles(HoldsDue):
            try:
                action = str(self.reactions.emit(HoldsDue(read, job_deadlines)))
            except Exception:
                logger.exception("placement holds refresh failed")
                action = "holds_refresh_failed"
            done[action] = 1
            if action not in UNCHANGED_HOLDS:  # it wrote (or may have): the syncs start from a fresh read
                read = self.data.cordons.worklist()
        for node, members in sorted(read.pending.items()):
            if short_of_time is not None and short_of_time():
                done["sync_deferred"] = done.get("sync_deferred", 0) + 1
                continue
            try:  # tried again at once: a node freed unmarked can be taken within the minute
                action = twice(partial(self.sync, node, members, read))
            except Exception:
                logger.exception("cordon sync failed", extra={"instance": node})
                action = "cordon_sync_failed"
            done[action] = done.get(action, 0) + 1
        return done

    # ---------------------------------------------------------------- operator
    def uncordon(self, node: str) -> str:
        """The operator says the node is healthy: its cordon goes (and its attribute)."""
        if not self.data.cordons.uncordon(node, clock.now()):
            return "not_cordoned"
        return self.sync_quietly(node)

    def limit_tripped_notice(self, decided: policy.CordonDecision, node: str, why: str) -> Owed:
        """Loud, once, by whoever tripped it (owed with the write that tripped it): known-bad
        nodes are no longer kept off ECS placement automatically (our own scheduler still
        skips them)."""
        tripped = str(decided.state.get("trip_reason") or decided.reason)
        return self.notices.for_node(
            NotificationKind.CORDON_LIMIT_TRIPPED,
            "Known-bad GPU nodes are no longer cordoned in ECS (cordon limit tripped)",
            container_inst_id=node, instance_id="",
            what_happened=f"{node} is known bad ({why}), but {tripped}",
            what_was_done=(f"{node} and every known-bad node after it stay out of the queue scheduler's "
                           "placements and of relocation, but do NOT get the ECS attribute "
                           f"{placement.UNAVAILABLE_ATTRIBUTE}: ECS may place tag-registered tasks on them "
                           "until the breaker is reset"),
            operator_action=("Find the common cause now (driver rollout, power, fabric, a bad health "
                             "check). Drain the bad nodes by hand if tag-registered jobs run here, then "
                             "`gpu-recovery-admin breaker reset --resume-backlog` (or --drop-backlog): the "
                             "held cordons are then put, a window's allowance at a time."))

    def limit_tripped(self, decided: policy.CordonDecision, node: str) -> None:
        """After the commit that tripped it: the metric and the log line."""
        self.metrics.add_metric("CordonLimitTripped", "Count", 1)
        why = str(decided.state.get("trip_reason") or decided.reason)
        logger.error("cordon limit tripped", extra={"why": why, "instance": node})
