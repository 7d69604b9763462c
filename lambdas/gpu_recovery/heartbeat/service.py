"""Node heartbeats: task reports, GPU telemetry and the stale sweep.

Bookkeeping (job table):

* a rank item carries ``last_heartbeat_at`` / ``last_seen_in_report_at`` and, while it
  is watched (RUNNING / NODE_LOST / HUNG with at least one heartbeat, its job in
  WATCHED_JOB_STATES; and a suspension's rank STOP_REQUESTED, until STOPPED:
  ``heartbeat.escalation``), ``hb_shard`` and
  ``hb_slot``: the sparse ``by-heartbeat-slot`` index then holds only watched ranks, over
  32 partition keys, sorted by the start of their last heartbeat's slot (half the stale
  threshold wide), so the sweep reads just the stale ones (``last_heartbeat_at < now -
  stale``) and a heartbeat moves the rank's index entry once a slot, on a partition of
  its own shard (docs/heartbeats.md, "The heartbeat index").
* a node that reports but omits a rank does not refresh it, so the same sweep catches
  a task missing from its node's reports.
* the job item keeps, per attempt, the string sets ``hb_lost_a<attempt>`` and
  ``hb_hung_a<attempt>`` of its NODE_LOST / HUNG ranks; the job's own state follows
  them (``_settle_job``) with conditional transitions, so concurrent reports and
  sweeps converge without "read, decide, write".

Writes per task report: one conditional UpdateItem per reported watched rank plus one
on the container-instance item (``last_report_at``); reads: one Query of the node's
live ranks (sparse ``by-container-instance`` index). State changes (lost, revived,
hung) cost a few more writes, but only when they happen. E-mails are owed in their write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gpu_recovery import clock
from gpu_recovery.constants import (
    HB_AT,
    JOB_BY_TASK_PK,
    JOB_PK,
    InstanceState,
    JobState,
    NotificationKind,
    RankState,
)
from gpu_recovery.domain import gpu_counters
from gpu_recovery.domain import heartbeat_policy as policy
from gpu_recovery.domain.evidence import ITEM_COUNTER_ANCHORS, ITEM_COUNTER_RATES, build_evidence
from gpu_recovery.domain.fault_catalog import FaultCatalog, default_catalog
from gpu_recovery.domain.fault_vocabulary import Trigger
from gpu_recovery.domain.gpu_warnings import DriverWarning, driver_warning, repaired_at, warning_record
from gpu_recovery.domain.heartbeat_policy import HardwareSignal, HeartbeatSettings, ReportedTask
from gpu_recovery.domain.models import Instance, Rank
from gpu_recovery.domain.notifications import NotificationFacts
from gpu_recovery.domain.states import HEARTBEAT_WATCHED_RANK_STATES
from gpu_recovery.heartbeat.escalation import NodeLostEscalation, lost_since
from gpu_recovery.heartbeat.ports import EcsPort, MetricsPort, NullMetrics, RecoveryPort
from gpu_recovery.heartbeat.results import GpuResult, ReplayedReport, ReportResult, SweepResult
from gpu_recovery.repository.heartbeat import (
    DISCONNECTED_SEEN,
    GPU_REPORT_VERSION,
    WATCHED_JOB_STATES,
    HeartbeatRepository,
    hung_attr,
    lost_attr,
)

if TYPE_CHECKING:  # the outbox is handed in (runtime): not loaded when the handler is imported
    from gpu_recovery.recovery.notices import Notices, Owed
    from gpu_recovery.repository.base import Update

logger = logging.getLogger(__name__)
_SUSPECT_HEADLINE = "GPU node shows hardware errors"

ACTOR = "heartbeat"
WATCHED = HEARTBEAT_WATCHED_RANK_STATES
_GPU_REPORT_RETRIES = 3
# A STARTING job with a NODE_LOST rank stays as it is (its launch or restart runs): its lost
# ranks are escalated once it runs. A SUSPENDING job's are escalated as it is
# (``heartbeat.escalation``): a node lost for good leaves a rank no stop can confirm, so the
# suspension could never complete (the job fails as a RUNNING one would).
_ESCALATES_LATER = frozenset({JobState.STARTING})


def _rank_label(item: dict[str, Any]) -> str:
    return str(item.get(JOB_PK, "?"))


class HeartbeatService:
    def __init__(
        self,
        repo: HeartbeatRepository,
        settings: HeartbeatSettings,
        ecs: EcsPort,
        notices: Notices,
        recovery: Callable[[], RecoveryPort],
        metrics: MetricsPort | None = None,
        catalog: FaultCatalog | None = None,
    ) -> None:
        self.repo = repo
        self.settings = settings
        self._slot_seconds = policy.heartbeat_slot_seconds(settings.stale_seconds)
        # The recovery loop's catalog (with the deployment's override): what a telemetry
        # signal "needs" must be what recovery will do about it.
        self.catalog = catalog or default_catalog()
        self.ecs = ecs
        self.notices = notices  # the e-mails: owed in the write that decides them, sent after it
        self._recovery = recovery
        self.metrics = metrics or NullMetrics()
        self.escalation = NodeLostEscalation(repo, settings, ecs, recovery, self.metrics,
                                             lambda rank, why: self._unwatch(rank, reason=why))

    # ============================================================== task reports
    def report_tasks(self, node_id: str, reported_at: float, tasks: Iterable[ReportedTask],
                     boot_time: float | None = None) -> ReportResult:
        """Refresh every watched rank the node lists; the node's own ``last_report_at``
        (and its ``boot_time``, when the agent sends it).

        Raises :class:`ReplayedReport` (nothing written) for a timestamp not newer than
        the node's last accepted task report.
        """
        now = clock.now()
        tasks = list(tasks)
        result = ReportResult(node_id)
        node = self._touch_node(node_id, reported_at, now, len(tasks), boot_time)
        requested = node.get("reboot_requested_at")
        if (boot_time is not None and node.get("instance_state") == InstanceState.REBOOTING.value
                and requested is not None and boot_time > float(requested)):
            # Booted after the reboot request: back, even if the agent-disconnect event
            # was never seen (the recovery loop checks the ECS agent is connected).
            self._recovery().on_boot_reported(node_id, boot_time)
        # A node that lists no task (a spare, a node between jobs) has nothing to refresh: its
        # ranks' index is not read (one Query saved per report of an idle node).
        by_key = self._live_ranks_by_key(node_id) if tasks else {}
        done: set[str] = set()
        for task in tasks:
            item = by_key.get(task.task_arn or "") or by_key.get(f"log:{task.running_log_id}")
            if item is None:
                result.unknown.append(task.key)
                continue
            label = _rank_label(item)
            if label in done:
                continue
            done.add(label)
            state = RankState(item["rank_state"])
            if state not in WATCHED:
                result.ignored[task.key] = f"rank {label} is {state.value}"
                continue
            self._refresh(item, task, now, result)
        if result.unknown:
            logger.info("report lists tasks this system does not track",
                        extra={"node_id": node_id, "unknown": result.unknown[:20]})
        self.metrics.add_metric("HeartbeatsRecorded", "Count", result.refreshed)
        return result

    def _touch_node(self, node_id: str, reported_at: float, now: float, task_count: int,
                    boot_time: float | None = None) -> dict[str, Any]:
        """Record the report on the node's item (registering the node on its first report)."""
        fields: dict[str, Any] = {"last_report_at": now, "reported_tasks": task_count}
        if boot_time is not None:
            fields["boot_time"] = boot_time
        written = self.repo.record_tasks_report(node_id, reported_at, fields)
        if written is not None:
            return written
        if self.repo.node_item(node_id) is not None:
            raise ReplayedReport(
                f"the last report accepted from node {node_id} carried this timestamp "
                f"({reported_at}); each report must carry its own send time")
        self._register_node(node_id)
        written = self.repo.record_tasks_report(node_id, reported_at, fields)
        if written is None:
            raise ReplayedReport(f"a report with timestamp {reported_at} from node {node_id} "
                                 "was accepted concurrently")
        return written

    def _register_node(self, node_id: str) -> None:
        """First report of a node without an item: record what ECS knows about it, so
        the recovery loop can reboot / drain it later (ec2 id and ARN)."""
        arn, ec2_id = "", ""
        try:
            described = self.ecs.describe_container_instance(node_id)
        except Exception:
            logger.warning("cannot describe the reporting node", exc_info=True,
                           extra={"node_id": node_id})
            described = None
        if described:
            arn = str(described.get("containerInstanceArn", ""))
            ec2_id = str(described.get("ec2InstanceId", ""))
        self.repo.register_node(Instance(node_id, container_instance_arn=arn, ec2_instance_id=ec2_id))

    def _live_ranks_by_key(self, node_id: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for item in self.repo.live_rank_items_on_node(node_id):
            if item.get(JOB_BY_TASK_PK):
                found[item[JOB_BY_TASK_PK]] = item
            if item.get("running_log_id") not in (None, ""):
                found[f"log:{item['running_log_id']}"] = item
            found[f"log:{item[JOB_PK]}"] = item  # running_log_id may be "<job_id>#<rank>"
        return found

    def _refresh(self, item: dict[str, Any], task: ReportedTask, now: float, result: ReportResult,
                 retry: bool = True) -> None:
        rank = self.repo.rank_from_item(item)
        state = rank.state
        verdict = policy.step_verdict(item.get("step"), item.get("step_changed_at"), task.step, now,
                                      self.settings.hang_seconds)
        fields = self.repo.heartbeat_fields(rank.job_id, rank.rank, now, self._slot_seconds)
        fields["last_seen_in_report_at"] = now
        if verdict.advanced:
            fields.update(step=task.step, step_changed_at=now)
        if task.remote_pid is not None:
            fields["remote_pid"] = task.remote_pid
        label = _rank_label(item)
        if state is RankState.NODE_LOST:
            # Back: the hang clock restarts, the job leaves NODE_LOST once no rank is lost.
            fields.setdefault("step_changed_at", now)
            ok = self._rank_and_job(rank, RankState.NODE_LOST, RankState.RUNNING, fields,
                                    delete={lost_attr(rank.attempt)},
                                    remove=["node_lost_at", DISCONNECTED_SEEN],
                                    reason=f"heartbeat again from rank {rank.rank}")
            if ok:
                result.revived.append(label)
                self.metrics.add_metric("RanksRevived", "Count", 1)
        elif state is RankState.HUNG and verdict.advanced:
            ok = self._rank_and_job(rank, RankState.HUNG, RankState.RUNNING, fields,
                                    delete={hung_attr(rank.attempt)}, remove=[],
                                    reason=f"rank {rank.rank} progresses again (step {task.step})")
            if ok:
                result.unhung.append(label)
        elif state is RankState.RUNNING and verdict.hung:
            owed = self._hung_notice(rank, item, task.step, now)
            ok = self._rank_and_job(rank, RankState.RUNNING, RankState.HUNG, fields,
                                    add={hung_attr(rank.attempt)}, remove=[],
                                    reason=f"rank {rank.rank} stuck at step {task.step}",
                                    also=self.notices.owe([owed], now))
            if ok:
                result.hung.append(label)
                self.notices.send([owed])
                self._on_hung(rank, task.step)
        else:
            ok = self.repo.refresh_rank(rank, fields)
        if ok:
            result.refreshed += 1
            return
        if not retry:
            result.ignored[task.key] = f"rank {label} changed concurrently"
            return
        # The index copy was stale (or a sweep raced us): decide again from the item.
        fresh = self.repo.rank_item(item[JOB_PK])
        if fresh is None or fresh.get(JOB_BY_TASK_PK) != item.get(JOB_BY_TASK_PK):
            result.ignored[task.key] = f"rank {label} now belongs to another task"
            return
        if RankState(fresh["rank_state"]) not in WATCHED:
            result.ignored[task.key] = f"rank {label} is {fresh['rank_state']}"
            return
        self._refresh(fresh, task, now, result, retry=False)

    def _rank_and_job(self, rank: Rank, from_state: RankState, to: RankState, fields: dict[str, Any],
                      *, reason: str, add: set[str] | None = None, delete: set[str] | None = None,
                      remove: list[str] | None = None, also: Sequence[Update] = ()) -> bool:
        """Rank transition + the job's per-attempt set (+ an e-mail owed), atomically; then settle."""
        if not self.repo.move_rank(rank, from_state, to, fields, add=add, delete=delete,
                                   remove=remove, also=also):
            job = self.repo.get_job(rank.job_id)
            if job is None or job.attempt != rank.attempt or job.state not in WATCHED_JOB_STATES:
                # A terminal / recovering / newer job never comes back through a heartbeat.
                self._unwatch(rank, reason="job is "
                              + (job.state.value if job else "missing"))
            return False
        logger.info("rank %s -> %s", from_state.value, to.value,
                    extra={"job_id": rank.job_id, "rank": rank.rank, "why": reason})
        self._settle_job(rank.job_id, rank.attempt, reason)
        return True

    def _unwatch(self, rank: Rank, reason: str) -> bool:
        """Drop a rank from the heartbeat index (its job no longer needs watching)."""
        done = self.repo.unwatch_rank(rank)
        if done:
            logger.info("rank no longer watched", extra={"job_id": rank.job_id, "rank": rank.rank,
                                                          "why": reason})
        return done

    def _settle_job(self, job_id: str, attempt: int, reason: str) -> JobState | None:
        """Make the job's state follow its lost / hung rank sets (conditional, convergent);
        returns the state it is left in (None: gone, another attempt, or a step raced).

        NODE_LOST wins over HUNG; HUNG -> NODE_LOST is not a legal transition, so it goes
        through RUNNING. Only a RUNNING job settles: a STARTING one (launch, gang restart)
        or a SUSPENDING one keeps its own machinery and deadline, and settles once it runs
        (the next sweep).
        Every writer settles after its own change, so the last one sees the final sets.
        """
        item = self.repo.job_item(job_id)
        if not item:
            return None
        if int(item.get("attempt", 1)) != attempt:
            return None
        state = JobState(item["job_state"])
        has_lost, has_hung = bool(item.get(lost_attr(attempt))), bool(item.get(hung_attr(attempt)))
        steps: list[tuple[JobState, JobState, str]] = []
        if state is JobState.NODE_LOST and not has_lost:
            steps.append((JobState.NODE_LOST, JobState.RUNNING, "none_lost"))
            state = JobState.RUNNING
        if state is JobState.HUNG and (not has_hung or has_lost):
            steps.append((JobState.HUNG, JobState.RUNNING, "none_hung_or_some_lost"))
            state = JobState.RUNNING
        if state is JobState.RUNNING and has_lost:
            steps.append((JobState.RUNNING, JobState.NODE_LOST, "some_lost"))
        elif state is JobState.RUNNING and has_hung:
            steps.append((JobState.RUNNING, JobState.HUNG, "some_hung_none_lost"))
        for source, target, requires in steps:
            deadline_at, escalate_at = self._backstop(target)
            if not self.repo.settle_job(job_id, attempt, source, target, requires, reason, ACTOR,
                                        deadline_at=deadline_at, escalate_at=escalate_at):
                return None
            logger.info("job %s -> %s", source.value, target.value,
                        extra={"job_id": job_id, "why": reason})
            self.metrics.add_metric(f"Jobs{target.value.title().replace('_', '')}", "Count", 1)
            state = target
        return state

    def _backstop(self, target: JobState) -> tuple[float | None, float | None]:
        """A job leaving RUNNING for NODE_LOST / HUNG stays in the deadline index (the
        recovery sweep's backstop, docs/recovery-loop.md): when this sweep should have handed
        it to the recovery loop (None: it never does), and when the backstop looks."""
        now = clock.now()
        escalate_at: float | None = None
        if target is JobState.NODE_LOST and self.settings.node_lost_fail_seconds > 0:
            escalate_at = now + self.settings.node_lost_fail_seconds
        elif target is JobState.HUNG and self.settings.hang_action == "recover":
            escalate_at = now
        if target not in (JobState.NODE_LOST, JobState.HUNG):
            return None, None
        return policy.backstop_deadline(now, escalate_at), escalate_at

    def _hung_notice(self, rank: Rank, item: dict[str, Any], step: int | None, now: float) -> Owed:
        """The e-mail of a rank found hung (its job's budget read before the move commits)."""
        since = item.get("step_changed_at") or now
        recover = self.settings.hang_action == "recover"
        used, allowed = self._recoveries(rank.job_id)
        return self.notices.for_facts(NotificationKind.HUNG, "Training rank hung", NotificationFacts(
            job_id=rank.job_id, ranks=[rank.rank], container_inst_id=rank.container_inst_id,
            instance_id=rank.ec2_instance_id,
            what_happened=(f"rank {rank.rank} has reported step {step} for {int(now - since)} s "
                           f"(threshold {self.settings.hang_seconds} s) while its node keeps "
                           "sending heartbeats"),
            what_was_done=("Job handed to the recovery loop (DCGM health check of the node)"
                           if recover else "Job marked HUNG; nothing was stopped"),
            attempt=used, max_attempts=allowed,
            operator_action=("Watch the recovery notifications for this job." if recover else
                             "Look at the rank's logs (NCCL timeouts, deadlocks, data loader); "
                             "stop the job if it does not progress again."),
        ))

    def _on_hung(self, rank: Rank, step: int | None) -> None:
        self.metrics.add_metric("RanksHung", "Count", 1)
        if self.settings.hang_action == "recover":
            self._recovery().report_suspected_fault(
                rank.job_id, rank.attempt, rank.container_inst_id,
                f"rank {rank.rank} hung at step {step} on {rank.container_inst_id}")

    # ============================================================== GPU reports
    def report_gpu(self, node_id: str, reported_at: float, gpus: list[dict[str, Any]],
                   unmapped_xids: list[dict[str, Any]] | None = None, error: str | None = None) -> GpuResult:
        """Store the node's telemetry and its hardware signals (bounded, pruned); a new
        signal flags the node SUSPECT and notifies, at most once per node and signal kind
        per ``signal_notify_seconds``.

        Raises :class:`ReplayedReport` (nothing written) for a repeat of the last report.
        """
        signals = policy.hardware_signals(gpus, self.catalog, unmapped_xids or [])
        result = GpuResult(node_id, len(gpus), signals=[s.fingerprint for s in signals])
        telemetry = policy.compact_telemetry(gpus)
        named = [(policy.gpu_name(g), g) for g in gpus]
        for _ in range(_GPU_REPORT_RETRIES):
            now = clock.now()
            node = self.repo.node_item(node_id)
            if node is None:
                self._register_node(node_id)
                node = self.repo.node_item(node_id) or {}
            if node.get("last_gpu_report_ts") == reported_at:
                raise ReplayedReport(
                    f"the last GPU report accepted from node {node_id} carried this timestamp "
                    f"({reported_at}); each report must carry its own send time")
            update = policy.update_signals(
                policy.stored_signals(node.get("hw_signals"), now), signals,
                node.get("hw_notified") or {}, now,
                retention_seconds=self.settings.signal_retention_seconds,
                notify_interval_seconds=self.settings.signal_notify_seconds,
                repaired_at=repaired_at(node),
            )
            # The counters' anchors and what rose (domain.gpu_counters): bounded by the GPUs.
            anchors, rates = gpu_counters.advance(node.get(ITEM_COUNTER_ANCHORS), named, now,
                                                  self.catalog.counter_window_seconds)
            fields: dict[str, Any] = {"gpu_telemetry": telemetry, "last_gpu_report_at": now,
                                      "gpu_count": len(gpus), "hw_signals": update.stored,
                                      "hw_notified": update.notified, ITEM_COUNTER_ANCHORS: anchors,
                                      ITEM_COUNTER_RATES: [r.to_dict() for r in rates if r.increase > 0]}
            if error:
                fields["gpu_report_error"] = error[:500]
            # Time-stamped XID log (the evidence of a fault): merged from what was read, and
            # the write holds only if no other report was written since (its version).
            old_events = node.get("gpu_events") or []
            new_events = policy.xid_events(gpus, unmapped_xids or [], now)
            events = policy.merge_gpu_events(old_events, new_events, now)
            if events != old_events:
                fields["gpu_events"] = events
            version = int(node.get(GPU_REPORT_VERSION) or 0)
            evidence = build_evidence(node_id=node_id, fault_at=now, trigger=Trigger.TELEMETRY,
                                      instance_item={**node, **fields}, catalog=self.catalog)
            warning = driver_warning(evidence, self.catalog)
            fresh, notify = update.fresh, update.notify
            if warning is not None:
                # The recovery loop acts on the warning and says so: the node's GPU state is not
                # flagged SUSPECT or e-mailed here (its XIDs still are).
                fresh = [s for s in fresh if s.kind in policy.EVENT_SIGNAL_KINDS]
                notify = [s for s in notify if s.kind in policy.EVENT_SIGNAL_KINDS]
            owed = self._suspect_notice(node_id, node, fresh, notify) if fresh and notify else None
            # Owed in the write that records the signals notified (the outbox).
            if self.repo.record_gpu_report(node_id, reported_at, version, fields, clear_error=not error,
                                           also=self.notices.owe([owed], now)):
                break
        else:
            raise ReplayedReport(f"GPU reports of node {node_id} keep arriving concurrently; "
                                 "send one report at a time")
        if warning is not None:
            result.warning = warning.rule_id
            self._warning(node_id, {**node, **fields}, warning, evidence.counter_rates, now)
        if fresh:
            result.new_signals = [s.fingerprint for s in fresh]
            result.suppressed = [s.fingerprint for s in update.suppressed if s in fresh]
            result.suspect = self._flag_suspect(node_id, fresh, notify, now)
            result.notified = bool(notify)
            self.notices.send([owed])
        return result

    def _warning(self, node_id: str, item: dict[str, Any], warning: DriverWarning,
                 rates: Iterable[gpu_counters.CounterRate], now: float) -> None:
        """The driver's warning in this report (a catalog rule with a ``warning``): on a node no
        recovery owns, its record (the intent) due for the recovery sweep now, once per rule
        (docs/driver-warnings.md)."""
        state = str(item.get("instance_state") or InstanceState.AVAILABLE.value)
        kept = item.get("warning") or {}
        repaired = repaired_at(item)
        if state not in (InstanceState.AVAILABLE.value, InstanceState.SUSPECT.value):
            return  # a recovery owns the node: its repair answers the warning too
        if kept.get("rule") == warning.rule_id and (repaired is None
                                                   or float(kept.get("since") or 0) >= repaired):
            return  # recorded already
        record = warning_record(warning, since=now, rates=rates)
        if self.repo.record_warning(node_id, record, now, stale_before=repaired):
            self.metrics.add_metric("DriverWarnings", "Count", 1)
            logger.warning("driver warning", extra={"node_id": node_id, "rule": warning.rule_id,
                                                    "why": warning.reason[:300]})
            try:
                # The node cordoned and its jobs asked to move now, not at the next sweep (a
                # job has that much more time to checkpoint before the GPU fails).
                self._recovery().gpu_warning(node_id)
            except Exception:
                logger.warning("driver warning not acted on yet; the recovery sweep does it", exc_info=True,
                               extra={"node_id": node_id})

    def _flag_suspect(self, node_id: str, fresh: list[HardwareSignal], notify: list[HardwareSignal],
                      now: float) -> bool:
        reason = "; ".join(s.describe() for s in fresh)
        flagged = self.repo.flag_suspect(node_id, now, reason)
        self.metrics.add_metric("HardwareSignals", "Count", len(fresh))
        if not notify:
            self.metrics.add_metric("HardwareSignalNotificationsSuppressed", "Count", len(fresh))
        return flagged

    def _suspect_notice(self, node_id: str, node: dict[str, Any], fresh: list[HardwareSignal],
                        notify: list[HardwareSignal]) -> Owed:
        """A node's new hardware signals' e-mail, from the node item read before the report's write."""
        live = self.repo.live_ranks_on_instance(node_id)
        jobs = sorted({r.job_id for r in live})
        state = str(node.get("instance_state") or "")
        held = len(fresh) - len(notify)
        # One job on the node: its ranks here and its recovery count; several: only their ids.
        used, allowed = self._recoveries(jobs[0]) if len(jobs) == 1 else (0, None)
        flagged = state in ("", InstanceState.AVAILABLE.value)
        return self.notices.for_facts(NotificationKind.SUSPECT_NODE, _SUSPECT_HEADLINE, NotificationFacts(
            job_id=", ".join(jobs), container_inst_id=node_id,
            ranks=sorted({r.rank for r in live}) if len(jobs) == 1 else (),
            attempt=used, max_attempts=allowed, instance_id=str(node.get("ec2_instance_id") or ""),
            what_happened=("GPU telemetry: " + "; ".join(s.describe() for s in notify[:16])
                           + (f"; and {len(notify) - 16} more" if len(notify) > 16 else "")
                           + (f" ({held} other new signal(s) of recently notified kinds)"
                              if held else "")),
            what_was_done=("Node flagged SUSPECT (was AVAILABLE)" if flagged else
                           f"Node left {state} (only AVAILABLE nodes are flagged SUSPECT)")
            + f"; further signals of these kinds are not e-mailed for "
              f"{self.settings.signal_notify_seconds} s",
            operator_action=("Drain the node when its jobs allow, run a DCGM diagnostic "
                             "(dcgmi diag -r 2) and reboot or replace the GPU as the signal says."),
        ))

    # ==================================================================== sweep
    def sweep(self) -> SweepResult:
        """Every minute: stale watched ranks -> NODE_LOST; NODE_LOST too long -> recovery."""
        now = clock.now()
        stale = self.settings.stale_seconds
        cutoff = policy.stale_cutoff(now, stale)
        items = self.repo.stale_rank_items(cutoff)
        result = SweepResult(read=len(items))
        node_ids = sorted({i.get("container_inst_id", "") for i in items} - {""})
        node_items = self.repo.node_items(node_ids)
        escalations: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
        settle: set[tuple[str, int]] = set()
        for item in items:
            rank = self.repo.rank_from_item(item)
            label = _rank_label(item)
            if rank.state in (RankState.RUNNING, RankState.HUNG):
                node_seen = (node_items.get(rank.container_inst_id) or {}).get("last_report_at")
                if node_seen is not None and node_seen >= cutoff:
                    reason = (f"rank {rank.rank} missing from node {rank.container_inst_id}'s "
                              f"reports for over {self.settings.stale_seconds} s")
                else:
                    reason = (f"no heartbeat from node {rank.container_inst_id} for over "
                              f"{self.settings.stale_seconds} s")
                if self._mark_lost(rank, item, now, reason):
                    result.marked_lost.append(label)
            elif rank.state is RankState.NODE_LOST:
                # The job follows its lost ranks (convergent): a rank marked lost by a
                # delivery that died before the job's own step is settled here.
                settle.add((rank.job_id, rank.attempt))
                fail_seconds = self.settings.node_lost_fail_seconds
                if policy.node_lost_expired(lost_since(item, stale), now, fail_seconds):
                    key = (rank.job_id, rank.attempt, rank.container_inst_id)
                    escalations.setdefault(key, []).append(item)
            elif rank.state is RankState.STOP_REQUESTED and policy.node_lost_expired(
                lost_since(item, stale), now, self.settings.node_lost_fail_seconds,
            ):
                # A suspension's rank asked to stop (kept watched until STOPPED) and silent as long:
                # its node may be lost under the stop (``heartbeat.escalation``).
                escalations.setdefault((rank.job_id, rank.attempt, rank.container_inst_id), []).append(item)
            elif rank.state is RankState.STOP_REQUESTED and self.settings.node_lost_fail_seconds > 0:
                continue  # not silent long enough yet (most leave the index with their STOPPED event)
            elif self._unwatch(rank, reason=f"rank is {rank.state.value}"):
                result.unwatched.append(label)
        waiting = {key for key in sorted(settle)
                   if self._settle_job(*key, "a rank is NODE_LOST") in _ESCALATES_LATER}
        for (job_id, attempt, inst_id), lost in sorted(escalations.items(), key=lambda kv: kv[0]):
            if (job_id, attempt) in waiting:
                continue  # escalated once the job runs and settles NODE_LOST (a later sweep)
            outcome = self.escalation.escalate(job_id, attempt, inst_id, lost, node_items.get(inst_id), now)
            if outcome == "recovery":
                result.escalated.append(job_id)
            elif outcome == "confirming":
                result.confirming.append(job_id)
            elif outcome == "failed":
                result.failed.append(job_id)
            elif outcome == "unwatched":
                result.unwatched.extend(_rank_label(i) for i in lost)
        self.metrics.add_metric("HeartbeatSweepRead", "Count", result.read)
        return result

    def _mark_lost(self, rank: Rank, item: dict[str, Any], now: float, reason: str) -> bool:
        fields = {"node_lost_at": now, "node_lost_reason": reason[:300]}
        # A heartbeat that lands between the query and this write wins.
        if not self.repo.mark_rank_lost(rank, item.get(HB_AT), fields):
            job = self.repo.get_job(rank.job_id)
            if job is None or job.attempt != rank.attempt or job.state not in WATCHED_JOB_STATES:
                self._unwatch(rank, reason="job is " + (job.state.value if job else "missing"))
            return False
        logger.warning("rank NODE_LOST", extra={"job_id": rank.job_id, "rank": rank.rank,
                                                 "why": reason})
        self.metrics.add_metric("RanksNodeLost", "Count", 1)
        self._settle_job(rank.job_id, rank.attempt, reason)
        return True

    # ================================================================= helpers
    def _recoveries(self, job_id: str) -> tuple[int, int | None]:
        """The job's infrastructure recoveries used and allowed, for an e-mail (None: not known)."""
        job = self.repo.get_job(job_id)
        return (job.recoveries_used, job.max_recovery_attempts) if job else (0, None)

