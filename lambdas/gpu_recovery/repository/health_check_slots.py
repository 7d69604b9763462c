"""DCGM health checks running at once: the cluster's slots and each job's share.

A slot is a *holder*: a claim token in the string set ``holders`` of a slot item, added
and deleted by plain conditional UpdateItems, never in a transaction (the slot items are
the hottest items of a cascade: a thousand claims within a second or two; plain updates of
one item serialize, where transactions touching it conflict). The cluster's slots are split
over ``HEALTH_CHECK_SLOT_SHARDS`` shard items, each with its share of the limit (the shares
sum exactly to it); a job's share, when it is counted, is its own item (``HC_SLOTS``).

A claim (HEALTH_CHECK_PENDING -> HEALTH_CHECKING) (1) adds its token to the shard of its
node (a stable hash) if the shard holds fewer than its share, or, when that one is full, to
one of the others that the shards' holders (one read) show room on; (2) adds it to its
job's item if the job's share is counted (a refusal deletes it from the shard again); (3)
commits the instance's claim with the token and the shard (``hc_slot_token``,
``hc_slot_shard``). A claim that lost the instance to another delivery deletes its token
again. Each delivery's token is its own (a random part): two deliveries of one claim never
share one, so the loser's give-back never frees the winner's slot. Each of these writes
passes its condition again when its token is already written, and is sent once more when its
answer is lost: a write retried after it landed (botocore's retry, or ours) is not read as
"full" or "raced", which would put one token on two shards or free a running check's slot.

Every way out of HEALTH_CHECKING (its verdict, no placement, no verdict, a timeout) commits
the instance's change first and then deletes the token from the items it is on
(:meth:`HealthCheckSlots.give_back`; idempotent). A delivery that dies between two of these
writes leaves a token nobody holds: it counts as a running check until the sweep's reaper
(:meth:`HealthCheckSlots.reap`, every ``REAP_EVERY_SECONDS``) deletes it: a token older than
``REAP_AFTER_SECONDS`` whose instance does not hold it (missing, not HEALTH_CHECKING, or
another token). A check holding its slot is never reaped, however long it runs; the age
only covers the claim in flight (token added, instance not yet claimed), which lasts one
invocation at most (Lambda's limit is 15 minutes). Until a leaked token is reaped the
cluster runs one check fewer than its limit allows (never more).

Each shard's holders are checked against its own share only, so the limit is exact while
it stays the same; one lowered while checks run binds as they end (the shards above their
new share refuse, the others may still fill theirs). Upgrade from the release before, which
counted a number ``running`` on the same items (and on the unsharded item
``SLOTS#health-checks``): a check it claimed (no token on the instance) gives its slot back
by decrementing that number, in its instance's transaction as before; ``running()`` counts
holders and that number, but a new claim's condition counts holders only, so during an
upgrade the cluster may briefly run up to the old checks more than its limit.

A check that finds no slot waits in its job's own queue (the sparse index
``by-health-check-wait``, oldest first): it does not time out while it waits, and a slot
given back starts the next one of that job; the sweep looks at the queue of every job in
recovery each minute (a check blocked by the cluster's limit is not forgotten) and at each
waiting check every ten minutes (one whose jobs all moved on is let go).
"""

from __future__ import annotations

import logging
import random
import secrets
from dataclasses import dataclass, replace
from enum import Enum
from functools import partial
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery.constants import (
    HC_WAIT_PK,
    HC_WAIT_SK,
    HEALTH_CHECK_SLOT_SHARDS,
    HEALTH_CHECK_SLOTS_KEY,
    INSTANCE_BY_HC_WAIT_INDEX,
    INSTANCE_PK,
    JOB_PK,
    health_check_slot_shard_key,
    health_check_slots_key,
)
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.shards import shard_order, shard_shares
from gpu_recovery.domain.states import InstanceState
from gpu_recovery.once_more import twice
from gpu_recovery.repository.base import Update

logger = logging.getLogger(__name__)

# A check waiting for a slot is looked at by the sweep this often (its jobs may be gone).
WAIT_SWEEP_SECONDS = 600
# A claim whose own shard is full tries at most this many others (those the counts show room on).
MAX_OTHER_SHARDS = 3
# The string set of a slot item: the claim tokens holding its slots.
HOLDERS = "holders"
# A token nobody holds is reaped once older than this: longer than any invocation can take
# between adding it and claiming its instance (Lambda's limit, 15 minutes, and a margin).
REAP_AFTER_SECONDS = 16 * 60
# The sweep's reaper runs at most this often, and looks up at most this many old tokens a run
# (one BatchGetItem of their instances).
REAP_EVERY_SECONDS = 600
MAX_REAPED_PER_TICK = 100


def _nonce() -> str:
    return secrets.token_hex(4)


def claim_token(inst_id: str, claimed_at: float, owner: str) -> str:
    """``<instance>|<claimed at, s>|<random>|<job whose share it holds, or empty>``: the
    reaper finds its instance and its job item from it; the random part keeps two
    deliveries of one claim from sharing a token."""
    return f"{inst_id}|{int(claimed_at)}|{_nonce()}|{owner}"


def token_instance(token: str) -> str:
    return token.split("|", 3)[0]


def token_owner(token: str) -> str:
    parts = token.split("|", 3)
    return parts[3] if len(parts) > 3 else ""


def token_age(token: str, now: float) -> float:
    parts = token.split("|", 3)
    try:
        return now - float(parts[1])
    except (IndexError, ValueError):  # not a token of ours: old enough to look up
        return float("inf")


class Claim(str, Enum):
    CLAIMED = "claimed"
    RACED = "raced"  # the instance moved on (another delivery claimed it)
    CLUSTER_FULL = "cluster_full"
    JOB_FULL = "job_full"


@dataclass(frozen=True)
class Taken:
    """What a claim took: its outcome and, when CLAIMED, the cluster shard its slot is on
    and the token holding it."""

    outcome: Claim
    shard: int | None = None
    token: str = ""


@dataclass(frozen=True)
class HealthCheckClaim:
    """A claim's outcome and, when CLAIMED, the instance as the claim wrote it (the shard
    and the job slot it recorded, which its release gives back): no read after the claim."""

    outcome: Claim
    instance: Instance | None = None


class HealthCheckSlots:
    def __init__(self, base: Any) -> None:
        self.base = base  # Repository

    @staticmethod
    def _cluster_key(shard: int | None) -> dict[str, str]:
        """One shard (None: the unsharded item of before)."""
        key = HEALTH_CHECK_SLOTS_KEY if shard is None else health_check_slot_shard_key(shard)
        return {INSTANCE_PK: key}

    def _job_key(self, job_id: str) -> dict[str, str]:
        return {JOB_PK: health_check_slots_key(job_id)}

    def _hold(self, table: str, key: dict[str, str], token: str, share: int,
              fields: dict[str, Any]) -> bool:
        """The token among the item's holders, if they are fewer than ``share``."""
        return self._apply_once_more_if_lost(Update(
            table=table, key=key, set_fields=fields, add_to_sets={HOLDERS: {token}},
            condition="attribute_not_exists(#h) OR size(#h) < :share OR contains(#h, :token)",
            condition_values={":share": share, ":token": token}, condition_names={"#h": HOLDERS}))

    def _apply_once_more_if_lost(self, update: Update) -> bool:
        """A write whose condition its own token passes: sent again when its answer is lost."""
        return bool(twice(partial(self.base.db.apply, update)))

    def _let_go(self, table: str, key: dict[str, str], token: str) -> None:
        """The token no longer among the item's holders (idempotent)."""
        self.base.db.apply(Update(table=table, key=key, delete_from_sets={HOLDERS: {token}}))

    def _legacy(self, table: str, key: dict[str, str], delta: int, fields: dict[str, Any]) -> Update:
        """The count of the release before (a check it claimed gives its slot back there)."""
        return Update(table=table, key=key, set_fields=fields, increments={"running": delta})

    @staticmethod
    def keeps_job_share(*, per_job: int, cluster: int) -> bool:
        """A job's running checks never exceed the cluster's: a share at least that large
        is never the limit, and is not counted."""
        return per_job < cluster

    def claim(self, claim: Update, owner: str, *, per_job: int | None, cluster: int, now: float) -> Taken:
        """The instance's claim (``claim``, built by the repository, keyed by the instance)
        with a slot of the cluster's and one of ``owner``'s (None: no share counted), or
        nothing. The cluster's slot is taken on the instance's shard, else on another shard
        with room; CLUSTER_FULL when none has (the shares sum to the cluster's limit). A
        CLAIMED answer names the shard its slot was taken on and the token."""
        inst_id = str(next(iter(claim.key.values())))
        token = claim_token(inst_id, now, owner if per_job is not None else "")
        shares = shard_shares(cluster, HEALTH_CHECK_SLOT_SHARDS)
        order = shard_order(inst_id, len(shares))
        shard = self._take_shard(order, shares, token)
        if shard is None:
            return Taken(Claim.CLUSTER_FULL)
        fields = {"item_type": "HC_SLOTS", "job_id_of": owner}
        if per_job is not None \
                and not self._hold(self.base.job_table_name, self._job_key(owner), token, per_job, fields):
            self._give_back_tokens(token, shard, None)
            return Taken(Claim.JOB_FULL)
        recorded = replace(
            claim, set_fields={**claim.set_fields, "hc_slot_shard": shard, "hc_slot_token": token},
            condition=f"({claim.condition}) OR #hc_token = :hc_token",
            condition_values={**claim.condition_values, ":hc_token": token},
            condition_names={**claim.condition_names, "#hc_token": "hc_slot_token"})
        if not self._apply_once_more_if_lost(recorded):
            self._give_back_tokens(token, shard, owner if per_job is not None else None)
            return Taken(Claim.RACED)
        return Taken(Claim.CLAIMED, shard, token)

    def _take_shard(self, order: list[int], shares: list[int], token: str) -> int | None:
        table, fields = self.base.instance_table_name, {"item_type": "HC_SLOTS"}
        if self._hold(table, self._cluster_key(order[0]), token, shares[order[0]], fields):
            return order[0]
        running = self.running_by_shard()
        others = [i for i in order[1:] if running.get(i, 0) < shares[i]][:MAX_OTHER_SHARDS]
        for shard in others:
            if self._hold(table, self._cluster_key(shard), token, shares[shard], fields):
                return shard
        return None

    def _give_back_tokens(self, token: str, shard: int, owner: str | None) -> bool:
        """The token off its job's item, then off its shard: best effort (what is left, the
        reaper frees: a token on a job's item is always on a shard too, until the shard's
        is deleted last). False when a write failed."""
        try:
            if owner:
                self._let_go(self.base.job_table_name, self._job_key(owner), token)
            self._let_go(self.base.instance_table_name, self._cluster_key(shard), token)
            return True
        except (ClientError, BotoCoreError):  # a lost write, not a bug: the reaper's to free
            logger.warning("health-check slot not given back; the sweep's reaper frees it",
                           exc_info=True, extra={"token": token, "shard": shard})
            return False

    def release(self, instance: Instance) -> list[Update]:
        """In the transaction of a way out of HEALTH_CHECKING: only a check claimed by the
        release before (no token) gives its slot back there, by its count; a token is given
        back after the commit (:meth:`give_back`)."""
        if not instance.hc_owner or instance.hc_slot_token:
            return []
        cluster = self._legacy(self.base.instance_table_name, self._cluster_key(instance.hc_slot_shard), -1,
                               {"item_type": "HC_SLOTS"})
        if not instance.hc_job_slot:
            return [cluster]
        return [cluster, self._legacy(self.base.job_table_name, self._job_key(instance.hc_owner), -1,
                                      {"item_type": "HC_SLOTS", "job_id_of": instance.hc_owner})]

    def give_back(self, instance: Instance) -> bool:
        """After a way out of HEALTH_CHECKING committed: its token off the items it is on."""
        if not instance.hc_slot_token or instance.hc_slot_shard is None:
            return True
        owner = token_owner(instance.hc_slot_token)
        return self._give_back_tokens(instance.hc_slot_token, instance.hc_slot_shard, owner or None)

    def reap(self, now: float, cap: int = MAX_REAPED_PER_TICK) -> int:
        """The sweep's reaper: tokens older than ``REAP_AFTER_SECONDS`` whose instance does
        not hold them (a claim or a release that died half-way) deleted, at most ``cap`` of
        them looked up (one BatchGetItem of their instances); one BatchGetItem of the shards
        first. Returns how many were deleted."""
        old: list[tuple[int, str]] = []
        for shard, item in self._shard_items().items():
            if shard is None:
                continue
            old += [(shard, t) for t in sorted(item.get(HOLDERS) or ())
                    if token_age(t, now) > REAP_AFTER_SECONDS]
        if len(old) > cap:
            # A sample, not the first ones: checks that legitimately run longer than
            # REAP_AFTER_SECONDS (their instances hold them) cannot hide the orphans behind.
            old = random.sample(old, cap)
        if not old:
            return 0
        ids = sorted({token_instance(t) for _, t in old})
        found = self.base.db.batch_get(self.base.instance_table_name, [{INSTANCE_PK: i} for i in ids])
        held = {str(i[INSTANCE_PK]): str(i.get("hc_slot_token") or "") for i in found
                if i.get("instance_state") == InstanceState.HEALTH_CHECKING.value}
        reaped = 0
        for shard, token in old:
            if held.get(token_instance(token)) == token:
                continue
            if not self._give_back_tokens(token, shard, token_owner(token) or None):
                break
            reaped += 1
        return reaped

    def waiting(self, job_id: str, limit: int) -> list[str]:
        """The job's checks waiting for a slot (their instances), oldest first."""
        page = self.base.db.query_page(
            self.base.instance_table_name, IndexName=INSTANCE_BY_HC_WAIT_INDEX, Limit=limit,
            KeyConditionExpression="#w = :w", ExpressionAttributeNames={"#w": HC_WAIT_PK},
            ExpressionAttributeValues={":w": job_id})
        return [str(i[INSTANCE_PK]) for i in page.get("Items", [])]

    def _shard_items(self) -> dict[int | None, dict[str, Any]]:
        """Every shard's item (None: the unsharded item), in one BatchGetItem."""
        keys: dict[str, int | None] = {HEALTH_CHECK_SLOTS_KEY: None}
        keys.update({health_check_slot_shard_key(i): i for i in range(HEALTH_CHECK_SLOT_SHARDS)})
        items = self.base.db.batch_get(self.base.instance_table_name, [{INSTANCE_PK: k} for k in keys])
        return {keys[str(i[INSTANCE_PK])]: i for i in items}

    def running_by_shard(self) -> dict[int | None, int]:
        """Checks running, per shard (None: the unsharded item): its holders, plus the count
        of the release before."""
        return {shard: len(i.get(HOLDERS) or ()) + int(i.get("running") or 0)
                for shard, i in self._shard_items().items()}

    def running(self) -> int:
        """Checks running in the cluster (the sum of the shards)."""
        return sum(self.running_by_shard().values())

    @staticmethod
    def wait_fields(job_id: str) -> dict[str, Any]:
        """On a waiting instance (with its ``hc_requested_at``, the index's sort key)."""
        return {HC_WAIT_PK: job_id}

    @staticmethod
    def wait_attributes() -> list[str]:
        return [HC_WAIT_PK]

    @staticmethod
    def held_attributes() -> list[str]:
        """What a claim records of the slots it holds (the owner whose share, whether it took
        one, the cluster shard): removed by every way out of HEALTH_CHECKING, with the release."""
        return ["hc_owner", "hc_job_slot", "hc_slot_shard", "hc_slot_token"]


__all__ = ["HC_WAIT_SK", "Claim", "HealthCheckClaim", "HealthCheckSlots", "Taken"]
