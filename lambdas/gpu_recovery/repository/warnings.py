"""The driver's warnings on a node (``recovery.warnings``, docs/driver-warnings.md), in intents.

The node item's ``warning`` (``domain.gpu_warnings.warning_record``) is written by the heartbeat
service with a deadline due at once (the intent); while the node runs jobs the recovery sweep
cordons it and asks each job to move, each step one conditional write or transaction here;
the node decision that repairs it (``node_decisions``) removes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_recovery.domain.gpu_warnings import job_key
from gpu_recovery.domain.states import InstanceState, JobState
from gpu_recovery.repository.base import Update
from gpu_recovery.repository.tables import RecoveryTables

#: Nodes a warning is acted on in: no recovery owns them.
WARNED_STATES = (InstanceState.AVAILABLE, InstanceState.SUSPECT)


class WarningRepository:
    """Intents of the warning stage (the cordon, the jobs asked to move, the end of it):
    ``repo.warnings``."""

    def __init__(self, tables: RecoveryTables) -> None:
        self.tables = tables
        self.db, self.cordons = tables.db, tables.cordons

    def _warning_update(self, node: str, rule: str, *, set_fields: Mapping[str, Any] | None = None,
                        names: Mapping[str, str] | None = None, remove: Sequence[str] = (),
                        deadline_at: float | None = None, clear_deadline: bool = False) -> Update:
        """An update of a warned node, only while it still carries that warning's record."""
        return self.tables.instance_update(
            node, from_states=WARNED_STATES, set_fields=dict(set_fields or {}), remove_fields=list(remove),
            deadline_at=deadline_at, clear_deadline=clear_deadline,
            extra_condition="#w.#wr = :wr", extra_values={":wr": rule},
            extra_names={"#w": "warning", "#wr": "rule", **dict(names or {})})

    def cordon_for_warning(self, node: str, rule: str, record: Mapping[str, Any], version: float,
                           deadline_at: float, breaker: Update | None = None,
                           also: Sequence[Update] = ()) -> bool:
        """The warned node takes no new work (its cordon, the attribute's worklist member, the
        cordon limit's state), looked at again by the sweep at ``deadline_at``."""
        update = self._warning_update(node, rule, set_fields=self.cordons.cordon_fields(record, version),
                                      deadline_at=deadline_at)
        return self.db.transact([update, self.cordons.sync_update(node, version),
                                 *([breaker] if breaker is not None else []), *also])

    def ask_job_to_move(self, node: str, rule: str, job_id: str, attempt: int, entry: Mapping[str, Any],
                        suspend: Mapping[str, Any], deadline_at: float, reason: str,
                        also: Sequence[Update] = ()) -> bool:
        """One transaction: the job asked on the node's record (once per attempt) and the job
        RUNNING -> SUSPENDING with the move (rank 0 is told through the control API and has
        until ``deadline_at`` to checkpoint and call go_suspend())."""
        node_update = self._warning_update(node, rule,
                                           set_fields={f"warning.jobs.{job_key(job_id)}": dict(entry)})
        job_update = self.tables.job_transition(
            job_id, JobState.SUSPENDING, from_states=[JobState.RUNNING], attempt=attempt, reason=reason,
            actor="recovery",
            set_fields={"suspend": dict(suspend), **self.tables.job_deadline_fields(deadline_at)})
        return self.db.transact([node_update, job_update, *also])

    def note_job_stays(self, node: str, rule: str, job_id: str, entry: Mapping[str, Any],
                       also: Sequence[Update] = ()) -> bool:
        """A job on the warned node that is not asked to move (it cannot be, or the warning
        does not move jobs): noted once per attempt, with its e-mail."""
        update = self._warning_update(node, rule, set_fields={f"warning.jobs.{job_key(job_id)}": dict(entry)})
        return self.db.transact([update, *also])

    def settle_warning(self, node: str, rule: str) -> bool:
        """A warning decided without changing the node (observe mode, a repair the breaker
        holds): off the sweep's index until it changes."""
        return self.db.apply(self._warning_update(node, rule, clear_deadline=True))

    def rearm_warning(self, node: str, rule: str, deadline_at: float) -> bool:
        return self.db.apply(self._warning_update(node, rule, deadline_at=deadline_at))

    def clear_warning(self, node: str, rule: str, now: float, *, uncordon: bool) -> bool:
        """The warning is gone (the driver no longer says so, the counters calmed down): the
        record and its deadline go, and the cordon it put (only that one) with it."""
        if not uncordon:
            return self.db.apply(self._warning_update(node, rule, remove=["warning"], clear_deadline=True))
        return self.cordons.end_with_its_cordon(node, now, lambda fields, gone: self._warning_update(
            node, rule, set_fields=fields, remove=["warning", *gone], clear_deadline=True), ("cause", rule))
