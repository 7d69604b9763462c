"""A large gang's fan-outs (``recovery.gang``): the stop and start intents' sends claimed and
confirmed, the paced stop rounds, the stop's end, and each rank's launch lease.

The intents themselves (``stop_fanout``, ``start_fanout`` on the job item) are committed with
the job's transition (``jobs_and_ranks``, ``restarts``); these records say how far their
sending went, so that a redelivery or the sweep sends what is unsent and nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpu_recovery import clock
from gpu_recovery.constants import JOB_PK, job_item_key, rank_item_key
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.states import JobState, RankState
from gpu_recovery.repository.base import DEADLINE_ATTRIBUTES, Update, from_ddb
from gpu_recovery.repository.records import is_rank_item, rank_from_item
from gpu_recovery.repository.tables import RecoveryTables

#: The item a launch lease creates for a rank never started (no rank of its own yet).
LEASE_ONLY = "RANK_LEASE"
#: What a start reads again of its launch's job, and the end of an aborted launch's stop of the
#: launch's rank items (``rank_state``: a rank registered, ``records.is_rank_item``).
_LAUNCH_JOB = ("attempt", "job_state")
_OPEN_LEASES = (JOB_PK, "rank_state", "attempt", "launch_attempt", "launch_lease_until", "launch_started_by")


@dataclass(frozen=True)
class LaunchLease:
    """A rank's launch lease of an attempt that registered no rank over it: its holder may have
    started the rank's task (``started_by``, recorded with the claim) and died before registering
    it; ``until`` 0: given back (nothing was started under it)."""

    job_id: str
    rank: int
    until: float
    started_by: str


class RankKey(Protocol):
    """A rank's item: its job and rank (a ``Rank``, or a ``RankTemplate`` to start)."""

    @property
    def job_id(self) -> str: ...
    @property
    def rank(self) -> int: ...


class GangFanoutRepository:
    """Intents of a gang's fan-outs (``repo.fanouts``)."""

    def __init__(self, tables: RecoveryTables) -> None:
        self.db, self.job_table_name = tables.db, tables.job_table_name

    def claim_send(self, job: Job, kind: str, attempt: int, now: float, lease_seconds: float) -> bool:
        """Claim the sending of ``attempt``'s fan-out: true for one caller until it confirms it
        (``record_sent``) or its lease runs out (it died before sending)."""
        return self.db.apply(Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job.job_id)},
            set_fields={f"{kind}.claimed_at": now},
            condition="#f.#a = :a AND attribute_not_exists(#f.#s) "
                      "AND (attribute_not_exists(#f.#c) OR #f.#c < :stale)",
            condition_values={":a": attempt, ":stale": now - lease_seconds},
            condition_names={"#f": kind, "#a": "attempt", "#s": "sent_at", "#c": "claimed_at"}))

    def record_sent(self, job: Job, kind: str, attempt: int, now: float) -> bool:
        """The fan-out's batches are on their queue (or were run): confirmed."""
        return self.db.apply(Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job.job_id)},
            set_fields={f"{kind}.sent_at": now},
            condition="#f.#a = :a", condition_values={":a": attempt},
            condition_names={"#f": kind, "#a": "attempt"}))

    def record_stop_round(self, job: Job, attempt: int, rounds: int, now: float) -> bool:
        """The stops of ``attempt`` were asked again (a paced round): when, and how often."""
        return self.db.apply(Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job.job_id)},
            set_fields={"stop_fanout.rounds": rounds, "stop_fanout.sent_at": now},
            condition="#f.#a = :a AND (attribute_not_exists(#f.#r) OR #f.#r < :r)",
            condition_values={":a": attempt, ":r": rounds},
            condition_names={"#f": "stop_fanout", "#a": "attempt", "#r": "rounds"}))

    def end_stop(self, job: Job, attempt: int) -> bool:
        """Every rank of ``attempt`` ended: nothing is left to stop (a terminal job leaves the
        deadline index)."""
        update = Update(
            table=self.job_table_name, key={JOB_PK: job_item_key(job.job_id)},
            # When the gang was stopped: the goodput ledger's stopping time ends there.
            set_fields={"stopped": {"attempt": attempt, "at": clock.now()}},
            remove_fields=["stop_fanout", *(DEADLINE_ATTRIBUTES if job.state.is_terminal else ())],
            condition="#f.#a = :a AND #st = :st",
            condition_values={":a": attempt, ":st": job.state.value},
            condition_names={"#f": "stop_fanout", "#a": "attempt", "#st": "job_state"})
        return self.db.apply(update)

    def rank_items(self, job_id: str, first: int, last: int) -> tuple[list[Rank], dict[int, int]]:
        """Ranks ``first`` to ``last - 1`` of a job as registered, and the attempt each rank's
        launch lease is for (the lease-only items of ranks never started included)."""
        keys = [{JOB_PK: rank_item_key(job_id, r)} for r in range(first, last)]
        ranks: list[Rank] = []
        leases: dict[int, int] = {}
        for raw in self.db.batch_get(self.job_table_name, keys):
            item = from_ddb(raw)
            rank = int(str(item[JOB_PK]).rsplit("#", 1)[1])
            if item.get("launch_attempt") is not None:
                leases[rank] = int(item["launch_attempt"])
            if is_rank_item(item):
                ranks.append(rank_from_item(item))
        return sorted(ranks, key=lambda r: r.rank), leases

    def claim_rank_launch(self, rank: RankKey, attempt: int, lease_until: float, now: float,
                          started_by: str = "") -> bool:
        """Start rank ``rank`` for ``attempt`` at most once at a time: a lease on the rank's item,
        which holds an earlier attempt's rank or none (a rank never started: the lease creates a
        lease-only item, ``RANK_LEASE``, that readers of ranks skip until the rank is registered
        over it). A holder that died lets the lease expire; the next one looks the task up by
        startedBy before starting it (recorded here: an aborted launch's stop looks up the task of
        a lease no rank was registered over, :meth:`open_launch_leases`)."""
        return self.db.apply(Update(
            table=self.job_table_name,
            key={JOB_PK: rank_item_key(rank.job_id, rank.rank)},
            set_fields={"launch_attempt": attempt, "launch_lease_until": lease_until,
                        "launch_started_by": started_by},
            set_if_absent={"item_type": LEASE_ONLY},
            condition=("(attribute_not_exists(#a) OR #a < :a) "
                       "AND (attribute_not_exists(#lu) OR #lu < :now)"),
            condition_values={":a": attempt, ":now": now},
            condition_names={"#a": "attempt", "#lu": "launch_lease_until"},
        ))

    def launch_job(self, job_id: str) -> tuple[int, JobState] | None:
        """A launch's job read again by a start under its leases (one consistent GetItem per start
        call, twice: of its attempt and state only, not the whole item); None: no such job."""
        item = self.db.get(self.job_table_name, {JOB_PK: job_item_key(job_id)}, attributes=_LAUNCH_JOB)
        if item is None:
            return None
        item = from_ddb(item)
        return int(item.get("attempt", 1)), JobState(item["job_state"])

    def open_launch_leases(self, job_id: str, attempt: int, world_size: int
                           ) -> tuple[dict[int, RankState], list[LaunchLease]]:
        """The end of an aborted launch's stop (in the sweep, until its leases are settled:
        ``world_size`` items, 100 a BatchGetItem, of the attributes read here only): the ranks
        ``attempt`` registered that did not end (rank -> state), and the leases of ``attempt`` no
        rank was registered over and not given back."""
        keys = [{JOB_PK: rank_item_key(job_id, r)} for r in range(world_size)]
        live: dict[int, RankState] = {}
        leases: list[LaunchLease] = []
        for raw in self.db.batch_get(self.job_table_name, keys, attributes=_OPEN_LEASES):
            item = from_ddb(raw)
            rank = int(str(item[JOB_PK]).rsplit("#", 1)[1])
            if is_rank_item(item) and int(item.get("attempt") or 0) >= attempt:
                state = RankState(item["rank_state"])
                if int(item.get("attempt", 1)) == attempt and not state.is_terminal:
                    live[rank] = state
                continue
            until = float(item.get("launch_lease_until") or 0)
            if int(item.get("launch_attempt") or 0) == attempt and until > 0:
                leases.append(LaunchLease(job_id, rank, until, str(item.get("launch_started_by") or "")))
        return dict(sorted(live.items())), sorted(leases, key=lambda lease: lease.rank)

    def release_rank_launch(self, rank: RankKey, attempt: int, until: float = 0) -> bool:
        """A rank of ``attempt`` that could not be placed: its launch lease ends now, so the
        next try (the sweep's, or a node freeing) may start it (looking it up first). ``until``:
        when it ended for an aborted launch's stop, which looks a lease up a little after its end
        (a lease taken over and given back: its claim's time, after its dead holder's lease)."""
        return self.db.apply(Update(
            table=self.job_table_name, key={JOB_PK: rank_item_key(rank.job_id, rank.rank)},
            set_fields={"launch_lease_until": until},
            condition="(attribute_not_exists(#a) OR #a < :a) AND #la = :a",
            condition_values={":a": attempt},
            condition_names={"#a": "attempt", "#la": "launch_attempt"}))
