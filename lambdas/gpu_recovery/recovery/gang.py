"""Stage: stopping and starting a whole gang, in batches, within the ECS limits.

A job of thousands of ranks cannot be stopped or restarted by one invocation: 1,024
StopTasks alone take 23 s at the account's ECS limit, and a restart as many again. So
the intent is committed first, on the job item, with the transition that needs it
(``stop_fanout`` with the job entering recovery, failing or being suspended;
``start_fanout`` with the gang restart's claim or the queue launch's), and the work is cut into
batches of consecutive ranks:

* **stop** batches of 100 ranks: each live rank is marked STOP_REQUESTED, then StopTask;
* **start** batches of 80 ranks: each rank's launch lease is claimed, its task looked up
  by ``startedBy`` if a lease is taken over, started (identical ranks up to 10 per
  StartTask, ``domain.launch_plan``) and registered as the new attempt's rank.

A queue launch's batches run in parallel with its abort (another batch's rank not placed, a
cancel), so a launch's start reads its job again after winning its leases (it starts nothing of
a launch that ended) and after registering (it stops what it started for a launch that ended
meanwhile); and the stop of a launch cut short ends only once no lease of it is open: a lease
whose holder died between its StartTask and its registration runs out, then its task is looked
up by the ``startedBy`` the lease recorded and stopped (:meth:`GangOps.end_aborted_launch`).

Batches go on an SQS queue (``GangQueuePort``) whose worker function runs a few at a
time; a gang of at most ``gang_inline_max_ranks`` ranks (16: ``Settings``) runs its batches
in the invocation that asks (the same code, no queue hop). Every ECS call takes a token from the stack's
shared budget (``gpu_recovery.adapters.ecs_budget``); a batch that would wait too long, or whose
invocation runs short of time, sends the rest of itself back to the queue, delayed. A
batch is idempotent: a redelivered or resent one skips what is done (ranks STOPPED or
registered) and repeats only what may not have happened (a StopTask of a rank marked but
maybe not asked, on a redelivery; a StartTask only after its ``startedBy`` was looked
up). Sending a queued stop fan-out is claimed on the intent first (``claimed_at``: the events
that read it unsent at once, a fault's first stopped ranks, would each send every batch)
and confirmed after (``sent_at``); the event's retry (a minute later) or the sweep sends an
unconfirmed intent again once its claim is stale (``recovery.fanout_send``). The sweep asks
stops again at a paced interval (2, 4, 8 ... minutes, and never before the fan-out's own
duration at the stack's ECS rate is over), never per redelivered event.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from gpu_recovery import clock
from gpu_recovery.adapters.ecs_budget import RateLimited
from gpu_recovery.adapters.errors import refused
from gpu_recovery.constants import (
    CLAIM_LEASE_SECONDS,
    LAUNCH_LEASE_SECONDS,
    MAX_STOP_ROUNDS,
    TAG_ATTEMPT,
    TAG_RANK,
    TAG_RANKS,
    system_stop_reason,
)
from gpu_recovery.domain.gang_batches import (
    START,
    STOP,
    GangBatch,
    GangQueuePort,
    batches,
)
from gpu_recovery.domain.latch import Latch
from gpu_recovery.domain.launch_plan import PlannedRank, StartCall, plan_calls, ranks_tag_value, spec_key
from gpu_recovery.domain.models import Job, Rank
from gpu_recovery.domain.rank_template import LAUNCH, RESTART, RankTemplate, intent_kind
from gpu_recovery.domain.remediation_mode import Effect
from gpu_recovery.domain.remediation_plan import RemediationPolicy
from gpu_recovery.domain.states import LIVE_RANK_STATES, STARTED_JOB_STATES, JobState, RankState
from gpu_recovery.domain.task_network import restart_network
from gpu_recovery.metric_names import METRIC_ABORTED_LAUNCH_STOPS_GIVEN_UP, METRIC_ENDED_JOB_STOPS_GIVEN_UP
from gpu_recovery.recovery.fanout_send import send_once
from gpu_recovery.recovery.lost_stop_events import ended_uncounted, handle_stopped
from gpu_recovery.recovery.ports import EcsPort, MetricsPort
from gpu_recovery.recovery.rank_templates import RankTemplates, RestartTemplates
from gpu_recovery.recovery.ranks import RankOperations, group_started_by
from gpu_recovery.recovery.reactions import (
    RankNotPlaced,
    RanksStarted,
    Reactions,
    StoppedEventLost,
    stop_may_go,
)
from gpu_recovery.recovery.task_starts import TaskRequest, start_once
from gpu_recovery.repository.faults import FaultRepository
from gpu_recovery.repository.gang_fanouts import GangFanoutRepository
from gpu_recovery.repository.latches import LatchRepository
from gpu_recovery.settings import Settings

logger = logging.getLogger(__name__)

# A rank asked to stop and still holding its GPUs is asked again (StopTask is idempotent)
# after RECHECK_SECONDS, then twice as long each round, for at most MAX_STOP_ROUNDS (constants).
RECHECK_SECONDS = 120
REASK_AFTER_SECONDS = 30
TIME_MARGIN_SECONDS = 10.0  # a batch stops and sends the rest of itself back this early
PREPAY_CALLS = 20
# A launch lease run out is looked up this much later: ECS lists a task a few seconds after its
# StartTask returned (made by the holder right before its lease ran out).
LOOKUP_AFTER_LEASE_SECONDS = 15


class LaunchMovedOn(Exception):
    """A queue launch's job moved on (aborted, canceled) while a start batch ran."""


@dataclass
class Dispatched:
    """A fan-out sent (or run inline): ``complete`` once every batch was sent (or finished);
    ``stopped`` the ranks an inline run asked ECS to stop."""

    complete: bool
    stopped: list[int] = field(default_factory=list)
    launch_over: bool = False  # a queue launch's run ended it (a rank not placed: aborted)

    def __bool__(self) -> bool:
        return self.complete


@dataclass
class BatchResult:
    done: bool = True  # False: the rest was sent back (or, inline, left to the sweep)
    stopped: list[int] = field(default_factory=list)
    started: list[int] = field(default_factory=list)
    rest: GangBatch | None = None
    delay_seconds: float = 0.0
    reason: str = ""
    launch_over: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"done": self.done, "stopped": len(self.stopped), "started": len(self.started),
                "delay_seconds": round(self.delay_seconds, 1), "reason": self.reason}


def is_launch_of(job: Job, attempt: int) -> bool:
    """The job's start intent is the queue launch of ``attempt``."""
    return bool(job.start_fanout) and intent_kind(job.start_fanout) == LAUNCH \
        and int(job.start_fanout.get("attempt") or 0) == attempt


class GangData(Protocol):
    """A batch's job and ranks (their stop asked), the latch the ranks arrive on."""

    latches: LatchRepository

    def get_job(self, job_id: str) -> Job | None: ...
    def get_rank_range(self, job_id: str, first: int, last: int) -> list[Rank]: ...
    def request_rank_stop(self, rank: Rank, why: str, now: float, *, watched: bool = False) -> bool: ...


@dataclass(eq=False, repr=False)
class GangOps:
    data: GangData
    fanouts: GangFanoutRepository  # the fan-outs' sends and rounds, each rank's launch lease
    ecs: EcsPort
    ranks: RankOperations
    faults: FaultRepository
    queue: GangQueuePort | None = None
    _: KW_ONLY
    policy: RemediationPolicy
    metrics: MetricsPort  # the service's relay: the invocation's metrics
    settings: Settings
    # Told: a restart's ranks all started, a rank not placed, a stopped task's lost event.
    reactions: Reactions = field(default_factory=Reactions)
    # A queue launch's ranks (``recovery.launch_templates``); None: launch intents refused.
    launches: RankTemplates | None = None

    # ------------------------------------------------------------------ dispatch
    def inline(self, job: Job) -> bool:
        return self.queue is None or job.world_size <= self.settings.gang_inline_max_ranks

    def stop(self, job: Job, *, round_: int = 0, look_up_missing: bool = True,
             resend: bool = False) -> Dispatched:
        """Send (or run) the batches of the job's stop intent; true once all were sent.
        ``look_up_missing=False`` (a caller whose role lists no tasks: the control API's
        preflight handover): with a rank not registered, nothing is sent and the sweep stops
        the gang (it finds the rank by its tags first). ``resend``: the sweep's send of an intent
        no send confirmed; run inline, its batches run as redelivered ones, since the send that
        died may have marked a rank and not asked its StopTask (a queued batch that died is
        delivered again by SQS itself)."""
        intent = job.stop_fanout
        if not intent:
            return Dispatched(True)
        attempt = int(intent.get("attempt") or job.attempt)
        why = str(intent.get("why") or job.last_error or "gang stopped")
        remediation = bool(intent.get("remediation", True))
        if attempt == job.attempt:
            if not look_up_missing:
                if not self.ranks.all_registered(job):
                    return Dispatched(False)
            elif not self.launch_cut_short(job, attempt) and not self.ranks.register_missing(job):
                # A rank never registered could not be stopped: found by its tags, and no stop until
                # its node is reserved. Not for a launch cut short: its rank started and not
                # registered is found by its lease (``end_aborted_launch``), with no scan of tasks.
                return Dispatched(False)
        # A suspension's ranks stay watched while asked to stop (``heartbeat.escalation``).
        work = batches(STOP, job.job_id, attempt, job.world_size, why=why, round_=round_,
                       remediation=remediation, watch=job.state is JobState.SUSPENDING)
        if not round_ and self.queue is not None and not self.inline(job):
            # Sent once (``recovery.fanout_send``): False while another invocation holds the claim.
            if not send_once(self.fanouts, self.queue, job, "stop_fanout", attempt, work):
                return Dispatched(False)
            self.metrics.add_metric("GangBatchesSent", "Count", len(work))
            return Dispatched(True)
        sent = self._dispatch(job, work, receive_count=2 if resend else 1)
        if not sent:
            return sent
        now = clock.now()
        if round_:
            self.fanouts.record_stop_round(job, attempt, round_, now)
        else:
            self.fanouts.record_sent(job, "stop_fanout", attempt, now)  # run inline
        return sent

    def start(self, job: Job) -> Dispatched:
        """Send (or run) the batches of the job's start intent (a gang restart's, a queue
        launch's); true once all were sent."""
        intent = job.start_fanout
        attempt = int(intent.get("attempt") or job.attempt)
        if not intent or attempt != job.attempt:
            return Dispatched(True)
        sent = self._dispatch(job, batches(START, job.job_id, attempt, job.world_size))
        if sent and not sent.launch_over:  # an aborted launch's intent is gone with it
            self.fanouts.record_sent(job, "start_fanout", attempt, clock.now())
        return sent

    def _dispatch(self, job: Job, work: list[GangBatch], *, receive_count: int = 1) -> Dispatched:
        if self.inline(job):
            results = [self.run(batch, receive_count=receive_count) for batch in work]
            return Dispatched(all(r.done for r in results), [r for res in results for r in res.stopped],
                              launch_over=any(r.launch_over for r in results))
        assert self.queue is not None
        self.queue.send([b.body() for b in work])
        self.metrics.add_metric("GangBatchesSent", "Count", len(work))
        return Dispatched(True)

    def stop_due(self, job: Job, now: float) -> str:
        """The sweep: an unsent stop intent is sent; ranks still holding their GPUs are asked
        again at a paced interval; once every rank ended, the intent is done."""
        intent = job.stop_fanout
        attempt = int(intent.get("attempt") or job.attempt)
        if Latch.ENDED in self.data.latches.complete(job.job_id, attempt, job.world_size) \
                or self._aborted_launch_stopped(job, attempt, now):
            self.fanouts.end_stop(job, attempt)
            return "stopped"
        if not intent.get("sent_at"):  # a job in recovery's nodes reserved first (``stop_may_go``)
            sent = stop_may_go(self.reactions, job, now) and self.stop(job, resend=True)
            return "stop_sent" if sent else "stop_pending"
        rounds = int(intent.get("rounds") or 0)
        if rounds >= MAX_STOP_ROUNDS:
            # Given up: a terminal job's intent ends; so does an aborted launch's (its job queued
            # again: the scheduler admits it no more while the intent lives, and the ranks were
            # asked to stop 1 + MAX_STOP_ROUNDS times). Any other's stays for its job's own step.
            aborted_launch = bool(intent.get("aborted_launch"))
            if not (job.state.is_terminal or aborted_launch):
                return "stop_given_up"
            # An ended job's ranks that never started (a restart failed part-way) never end:
            # only a rank registered and not ended may still run. Read before the intent goes.
            maybe_running = aborted_launch or bool(
                self.data.latches.registered_not_ended(job.job_id, attempt, job.world_size))
            if self.fanouts.end_stop(job, attempt) and maybe_running:
                self._stops_given_up(job, attempt, rounds, aborted_launch)
            return "stop_given_up"
        wait = max(RECHECK_SECONDS * 2 ** rounds, self.fanout_seconds(job) + REASK_AFTER_SECONDS)
        if now < float(intent["sent_at"]) + wait:
            return "stop_waiting"
        return "stop_reasked" if self.stop(job, round_=rounds + 1) else "stop_pending"

    def _stops_given_up(self, job: Job, attempt: int, rounds: int, aborted_launch: bool) -> None:
        """A stop intent ended with a rank maybe still running (its node's agent gone): counted (an
        alarm pages) and logged, flushed at once (the intent is gone: nothing would count it again)."""
        if aborted_launch:  # its job may be admitted again meanwhile
            self.metrics.add_metric_now(METRIC_ABORTED_LAUNCH_STOPS_GIVEN_UP, "Count", 1)
            logger.error("stops of an aborted launch given up: a rank may still run; look at its node",
                         extra={"job_id": job.job_id, "attempt": attempt, "rounds": rounds})
        else:  # an ended job's rank may run on, holding its node's GPUs
            self.metrics.add_metric_now(METRIC_ENDED_JOB_STOPS_GIVEN_UP, "Count", 1)
            logger.error("stops of an ended job given up: a rank may still run; look at its node",
                         extra={"job_id": job.job_id, "attempt": attempt, "rounds": rounds,
                                "job_state": job.state.value})

    @staticmethod
    def launch_cut_short(job: Job, attempt: int) -> bool:
        """The stop intent is a queue launch's cut short (aborted, or canceled before it completed)."""
        return bool(job.stop_fanout.get("aborted_launch")) or is_launch_of(job, attempt)

    def _aborted_launch_stopped(self, job: Job, attempt: int, now: float) -> bool:
        """The stop of a queue launch cut short ends once every rank it registered ended and no
        lease of it is open (its other ranks never started); a fault of the attempt's, once their ends
        are counted on the latch's head (one whose count died: the paced rounds handle its event)."""
        latches, faulted = self.data.latches, job.in_fault and attempt == job.attempt
        if not self.launch_cut_short(job, attempt) \
                or not (latches.ends_settled(job.job_id, attempt, job.world_size) if faulted
                        else not latches.registered_not_ended(job.job_id, attempt, job.world_size)):
            return False
        return self._launch_settled(job, attempt, now)

    def end_aborted_launch(self, job: Job, attempt: int, asked: Collection[int]) -> bool:
        """An aborted launch started inline whose stops ECS took: its stop intent ends now if each
        rank not ended is one this invocation asked ECS to stop (``asked``) and no lease is open;
        else the sweep ends it (``stop_due``: a start in flight elsewhere, or a rank marked and
        maybe not asked, which its paced rounds ask). One read of the ranks (``gang_inline_max_ranks``)."""
        if not self._launch_settled(job, attempt, clock.now(), asked=asked):
            return False
        return self.fanouts.end_stop(job, attempt)

    def _launch_settled(self, job: Job, attempt: int, now: float, *, asked: Collection[int] = ()) -> bool:
        """No rank of a launch cut short is left to stop: each rank it registered ended (or is
        among ``asked``: its StopTask made by the caller) and no lease of it is open. A lease run
        out with no rank registered over it (its holder died, maybe after its StartTask): its task
        is looked up by the lease's startedBy and stopped, and the lease given back once none is
        listed (a lease taken meanwhile is its holder's: it reads the job and starts nothing)."""
        live, leases = self.fanouts.open_launch_leases(job.job_id, attempt, job.world_size)
        if any(rank not in asked for rank in live):
            return False
        settled = True
        listed: dict[str, list[str]] = {}
        for lease in leases:
            if now < lease.until + LOOKUP_AFTER_LEASE_SECONDS:
                settled = False  # its holder may be starting the rank
                continue
            if lease.started_by and lease.started_by not in listed:
                listed[lease.started_by] = tasks = self.ecs.tasks_started_by(lease.started_by)
                for task_arn in tasks:
                    logger.warning("stopping a task of an aborted launch never registered", extra={
                        "job_id": job.job_id, "attempt": attempt, "rank": lease.rank, "task": task_arn})
                    self.ecs.stop_task(task_arn, system_stop_reason(
                        f"launch of attempt {attempt} aborted; its task was never registered"))
            if listed.get(lease.started_by):
                settled = False  # looked up again at the next sweep: not listed once stopping
            else:
                self.fanouts.release_rank_launch(lease, attempt)
        return settled

    def stopped(self, job: Job, attempt: int) -> None:
        """Every rank of ``attempt`` ended: nothing is left to stop (the intent is done)."""
        self.fanouts.end_stop(job, attempt)

    def release_launch(self, rank: RankTemplate, attempt: int) -> None:
        """A rank of ``attempt`` not placed: its launch lease ends, for the next try to take."""
        self.fanouts.release_rank_launch(rank, attempt)

    def fanout_seconds(self, job: Job) -> float:
        """How long the stops of the job's ranks take at the stack's ECS budget: a paced round
        asks again no sooner than that and a re-ask's 30 s (8,192 ranks take 228 s at 36 a
        second, more than the first recheck's 120 s: a round then would race the fan-out for the
        ranks it has not reached)."""
        return job.world_size / self.settings.ecs_api.rate

    # -------------------------------------------------------------------- worker
    def run(self, batch: GangBatch, *, receive_count: int = 1,
            time_left: Callable[[], float] | None = None) -> BatchResult:
        """Run one batch (the queue's worker, or inline). A batch that cannot finish sends
        the rest of itself back to the queue (inline: leaves it to the sweep)."""
        result = BatchResult()
        try:
            if batch.op == STOP:
                self._stop_batch(batch, receive_count, time_left, result)
            else:
                self._start_batch(batch, receive_count, time_left, result)
        except RateLimited as limited:
            result.done, result.rest = False, result.rest or batch
            result.delay_seconds = max(result.delay_seconds, limited.wait_seconds)
            result.reason = "rate limited"
        if not result.done and result.rest is not None and self.queue is not None \
                and not self._inline_batch(batch):
            self.queue.send([result.rest.body()], delay_seconds=math.ceil(result.delay_seconds))
            self.metrics.add_metric("GangBatchesDeferred", "Count", 1)
        return result

    def _inline_batch(self, batch: GangBatch) -> bool:
        return self.queue is None or (batch.last <= self.settings.gang_inline_max_ranks and batch.first == 0)

    @staticmethod
    def _short_of_time(time_left: Callable[[], float] | None) -> bool:
        return time_left is not None and time_left() < TIME_MARGIN_SECONDS

    # ---------------------------------------------------------------------- stop
    def _stop_batch(self, batch: GangBatch, receive_count: int, time_left: Callable[[], float] | None,
                    result: BatchResult) -> None:
        if batch.remediation and not self.policy.modes.executes(Effect.STOP_TASKS):
            result.reason = "observe mode: ranks not stopped"
            return
        repo = self.data
        now = clock.now()
        reask = receive_count > 1 or batch.round > 0
        ranks = [r for r in repo.get_rank_range(batch.job_id, batch.first, batch.last)
                 if r.attempt == batch.attempt]
        todo = [r for r in ranks
                if r.state in LIVE_RANK_STATES
                or (reask and r.state is RankState.STOP_REQUESTED
                    and (r.stop_requested_at or 0.0) <= now - REASK_AFTER_SECONDS)]
        reason = system_stop_reason(batch.why)
        if reask and self.reactions.handles(StoppedEventLost):
            # Their STOPPED events lost, or their handling dead after the rank's write: handled as
            # those events (``recovery.lost_stop_events``) instead of stopped again.
            uncounted = ended_uncounted(self.data.latches, batch, ranks)
            if todo or uncounted:
                todo, found = handle_stopped(self.ecs, self.reactions, todo, uncounted)
                result.stopped.extend(found)
        failure: ClientError | BotoCoreError | None = None
        for index, rank in enumerate(todo):
            if self._short_of_time(time_left):
                result.done, result.rest, result.reason = False, replace(batch, first=rank.rank), "time"
                return
            if index % PREPAY_CALLS == 0:
                try:
                    self.ecs.prepay(min(PREPAY_CALLS, len(todo) - index))
                except RateLimited as limited:
                    result.done, result.rest = False, replace(batch, first=rank.rank)
                    result.delay_seconds, result.reason = limited.wait_seconds, "rate limited"
                    return
            if rank.state in LIVE_RANK_STATES and not repo.request_rank_stop(rank, batch.why, clock.now(),
                                                                              watched=batch.watch):
                continue  # it ended (or was marked) meanwhile
            try:
                self.ecs.stop_task(rank.task_arn, reason)
            except (ClientError, BotoCoreError) as error:
                # Marked: asked again by a redelivery or the paced rounds. The batch's other ranks
                # are asked first (a node AWS takes at a deadline may be the next rank's).
                failure = failure or error
                continue
            result.stopped.append(rank.rank)
        if failure is not None:
            raise failure

    # --------------------------------------------------------------------- start
    def templates(self, job: Job) -> RankTemplates:
        """The source of the ranks the job's start intent starts, by the intent's kind."""
        kind = intent_kind(job.start_fanout)
        if kind == RESTART:
            return RestartTemplates(self.data, self.faults, self.ranks)
        if kind == LAUNCH and self.launches is not None:
            return self.launches
        raise ValueError(f"no source for a start intent of kind {kind!r}")

    def _start_batch(self, batch: GangBatch, receive_count: int, time_left: Callable[[], float] | None,
                     result: BatchResult) -> None:
        repo = self.data
        job = repo.get_job(batch.job_id)
        if job is None or job.attempt != batch.attempt or job.state not in STARTED_JOB_STATES:
            result.reason = "job moved on"  # an ended job's stop fan-out stops what was started
            return
        source = self.templates(job)
        read = source.read(job, batch.first, batch.last)
        complete = False
        if read.registered:
            # A delivery that died between a registration and its latch (a redelivery, or the
            # sweep's resend of the batch, which SQS counts as a first receive): arrive again.
            for rank in read.registered:
                complete |= Latch.REGISTERED in repo.latches.arrive(
                    job.job_id, job.attempt, job.world_size, rank.rank, [Latch.REGISTERED],
                    node=rank.container_inst_id, registered_at=rank.registered_at)
        planned = [PlannedRank(t.rank, t.node, self._spec(t)) for t in read.planned]
        failure: ClientError | BotoCoreError | None = None
        for call in plan_calls(planned, batching=self.settings.batch_identical_starts):
            todo = [read.startable[r] for r in call.ranks if r in read.startable]
            if not todo:
                continue
            if self._short_of_time(time_left):
                result.done, result.rest, result.reason = False, batch, "time"
                return
            try:
                started, failed, completed = self._start_call(job, call, todo, source)
            except LaunchMovedOn:
                result.reason = "job moved on"
                return
            except (ClientError, BotoCoreError) as error:
                # Its lease stays (looked up when tried again): the batch's other calls go first.
                failure = failure or error
                continue
            result.started += started
            complete |= completed
            launch = intent_kind(job.start_fanout) == LAUNCH
            if failed and launch:
                # Not started: their leases end before the abort, whose stop ends once none is open.
                for template, _why, _code in failed:
                    self.fanouts.release_rank_launch(template, job.attempt)
            for template, why, code in failed:
                # A placement race waits (GangRestart), it never stops the batch's other calls.
                self.reactions.emit(RankNotPlaced(job, template, why, code))
                result.reason = f"rank {template.rank} could not be started: {why}"
            if failed and launch:
                result.launch_over = True
                return  # a queue launch not placed is aborted: nothing more of it is started
        if complete:
            self.reactions.emit(RanksStarted(repo.get_job(job.job_id) or job))
        if failure is not None:
            raise failure

    def _launch_moved_on(self, job: Job) -> bool:
        """The launch's job, read again (a consistent GetItem of its attempt and state), left this
        attempt (aborted, canceled; a launch completed meanwhile by another batch has not)."""
        fresh = self.fanouts.launch_job(job.job_id)
        return fresh is None or fresh[0] != job.attempt or fresh[1] not in STARTED_JOB_STATES

    def _stop_started(self, job: Job, started: list[int]) -> None:
        """Ranks this call started and registered for a launch aborted (or canceled) meanwhile:
        the abort's stop may have read their items before: they are stopped here (marked first,
        as the stop fan-out does; one marked and not asked is asked by its paced rounds)."""
        why = f"launch of attempt {job.attempt} ended while its ranks started"
        for rank in self.data.get_rank_range(job.job_id, min(started), max(started) + 1):
            if rank.rank in started and rank.attempt == job.attempt and rank.state in LIVE_RANK_STATES \
                    and self.data.request_rank_stop(rank, why, clock.now()):
                self.ecs.stop_task(rank.task_arn, system_stop_reason(why))

    @staticmethod
    def _spec(rank: RankTemplate) -> str:
        return spec_key(rank.task_definition_arn, rank.overrides, rank.group, rank.gpus, rank.tags,
                        (TAG_RANK, TAG_RANKS, TAG_ATTEMPT))

    def _start_call(self, job: Job, call: StartCall, todo: list[RankTemplate], source: RankTemplates
                    ) -> tuple[list[int], list[tuple[RankTemplate, str, str]], bool]:
        """Start the ranks of one call whose lease this delivery wins; returns the ranks
        started (and registered), those that could not be placed (why, and the API error of a
        queue launch's StartTask refused), and whether a registration completed the attempt's
        latch."""
        attempt = job.attempt
        now = clock.now()
        # A restart's or a launch's in a recovery function; a launch's also in the scheduler's tick.
        launch = intent_kind(job.start_fanout) == LAUNCH
        lease_until = now + (LAUNCH_LEASE_SECONDS if launch else CLAIM_LEASE_SECONDS)
        started_by = group_started_by(job.job_id, attempt, call)
        claimed = [t for t in todo
                   if self.fanouts.claim_rank_launch(t, attempt, lease_until, now, started_by)]
        if not claimed:
            return [], [], False  # another delivery is starting them
        if launch and self._launch_moved_on(job):
            # Aborted (or canceled) since the batch read the job: nothing of it is started. Its
            # abort came after these claims otherwise: its stop sees the leases (they stay open
            # while the start runs) and ends once they are settled. A lease taken over stays: its
            # dead holder may have started the task, which the stop looks up once it runs out.
            for template in claimed:
                if template.launch_attempt != attempt:
                    self.fanouts.release_rank_launch(template, attempt)
            raise LaunchMovedOn(job.job_id)
        on_node = {t.node: t for t in claimed}  # a call starts one rank a node
        first = claimed[0]
        tags = first.tags
        if call.grouped:
            tags = [t for t in tags if t.get("key") != TAG_RANK]
            tags.append({"key": TAG_RANKS, "value": ranks_tag_value(call.ranks)})
        request = TaskRequest(first.task_definition_arn, started_by, first.overrides, tags,
                              first.group or None)
        started: list[int] = []
        complete = False

        def register(node: str, task_arn: str, started_at: float | None = None) -> None:
            nonlocal complete
            template = on_node[node]
            complete |= Latch.REGISTERED in source.register(job, template, task_arn, started_by, started_at)
            started.append(template.rank)

        def found(node: str, task_arn: str, started_at: float | None) -> None:
            # Started by the dead holder of the lease taken over: the rank ran from its task's
            # start (as ECS described it), else from right after the lease's claim (its length
            # before its end), not from now (the goodput ledger's restart ends at the last
            # rank's start, issue 52).
            template = on_node[node]
            claimed = template.lease_until - (LAUNCH_LEASE_SECONDS if launch else CLAIM_LEASE_SECONDS)
            if started_at is None and template.launch_attempt == attempt and template.lease_until:
                started_at = claimed
            register(node, task_arn, min(started_at, now) if started_at is not None else None)

        # A lease taken over: the task may exist already. Look before starting (on every node of
        # the call: those of the ranks registered already have a task of it too). A call that
        # started nothing (``start_once``'s not_started) gives the leases back: no wait on them.
        taken_over = any(t.launch_attempt == attempt for t in claimed)
        # A restart's placement race is tried again at once; a queue launch not placed is requeued.
        tries = 1 if launch else self.settings.restart_start_retries
        try:
            unplaced = start_once(
                self.ecs, request, {node: t.container_instance_arn for node, t in on_node.items()}, register,
                look_up=call.nodes if taken_over else (), tries=tries, found=found,
                not_started=lambda: [self.fanouts.release_rank_launch(t, attempt, now) for t in claimed],
                network=lambda nodes: restart_network(job.network, [on_node[node].subnet for node in nodes]))
        except ClientError as error:
            if not launch or error.operation_name != "StartTask" or not refused(error):
                # A registration or a StartTask failed (5xx, an answer lost): the lease stays.
                raise
            # A queue launch's StartTask refused (its task definition or overrides: the launch
            # fails; throttled: the sweep sends it again): the launch's end decides.
            err = error.response.get("Error", {})
            code, message = str(err.get("Code", "")), str(err.get("Message", ""))
            return started, [(t, f"{code}: {message}", code) for node, t in on_node.items()
                             if t.rank not in started], complete
        if launch and started and self._launch_moved_on(job):
            self._stop_started(job, started)
        if unplaced:
            logger.warning("start placement failed", extra={
                "job_id": job.job_id, "ranks": [on_node[node].rank for node in unplaced],
                "reasons": dict(unplaced)})
        # ECS's reason per node (RESOURCE:GPU, AGENT, MISSING): the rank's, for its wait.
        return started, [(on_node[node], ", ".join(r for r in why if r) or "no placement", "")
                         for node, why in unplaced.items()], complete
