"""Remediation scenarios: one per class of the fault catalog, each in its own simulated
cluster (moto + simulated ECS, AWS-shaped events delivered at least once, the sweep
every minute), through the same handlers the stack deploys.

1. ``fast_path`` — XID 79 (GPU fallen off the bus) is reported by the node agent; the
   rank dies: the node is rebooted at once, without the ~2 min DCGM diag, the job restarts.
   ``gpu_reset`` — a row remap pending on node-b: DCGM's check says reset, the node's GPUs
   are reset by the reset task (no reboot), the job restarts and completes.
2. ``flapping`` — the same node faults three times: rebooted twice (the job charged once),
   then replaced (drained) on its 3rd fault; the relocatable job moves to a spare node.
3. ``relocation`` — a dead GPU: DCGM says replace, the node is quarantined, the job's rank
   moves to a healthy spare node and the job completes.
4. ``breaker`` — 4 of 16 nodes fault within 10 minutes: 3 are rebooted, the 4th trips the
   blast-radius breaker (one e-mail, the action kept in its backlog), a 5th fault is not
   acted on either; the jobs on the two held nodes (not relocatable) wait HELD, not
   failed, and nothing is placed on those nodes; an operator's reset releases the backlog,
   the nodes are rebooted and the held jobs restart on them.
   ``breaker_autoclose`` — the same storm with nobody to reset it: the rebooted nodes come
   back healthy, a window after the trip the breaker closes by itself (one e-mail) and
   releases the held reboot; a later reboot-fixable fault is rebooted at once, not HELD.
   ``breaker_refault`` — a node rebooted in the storm faults again: the breaker stays open
   until an operator resets it, and says so (one e-mail, ``breaker show``).
5. ``observe`` — observe mode: the fault is detected, classified and e-mailed with what would
   have been done; no StopTask, reboot, drain or termination.
6. ``persistence_mode`` — the DCGM diag fails only on "persistence mode disabled" (error 29,
   severity config): operator action, the node drained, never rebooted.

``run_all()`` returns a :class:`ScenarioResult` per scenario; each carries the problems
found (empty: it ended exactly as described). ``make demo`` prints them; tests assert them.
"""

from __future__ import annotations

import argparse
import json
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C

from .world import World, build_world

MIN = 60


@dataclass
class ScenarioResult:
    name: str
    title: str
    problems: list[str]
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # instance items by node name
    counters: dict[str, int] = field(default_factory=dict)
    notifications: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    # job -> attempt -> node -> the fault's evidence and decision (suspect items, last fault)
    fault_records: dict[str, dict[int, dict[str, dict[str, Any]]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def fault_record(self, job_id: str, attempt: int) -> dict[str, Any]:
        """The first node's record of the fault of ``attempt`` (tests of one-node faults)."""
        records = self.fault_records.get(job_id, {}).get(attempt) or {}
        return next(iter(records.values())) if records else {}

    def kinds(self) -> list[str]:
        return [str(n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE)) for n in self.notifications]


@contextmanager
def world(*, remediation: dict[str, Any] | None = None, max_recovery_attempts: int = 3,
          relocate_instead_of_wait: bool = False, duplicate_delivery: bool = True,
          relocation_wait_seconds: int | None = None, spare_nodes: str | None = None,
          lend_spares: bool = False, extra_env: dict[str, str] | None = None,
          **sim_options: Any) -> Iterator[World]:
    warnings.filterwarnings("ignore")
    logging.getLogger().setLevel(logging.CRITICAL)
    env = {"POWERTOOLS_LOG_LEVEL": "CRITICAL", **(extra_env or {})}
    if remediation:
        env[C.ENV_REMEDIATION_SETTINGS] = json.dumps(remediation)
    if relocate_instead_of_wait:
        env[C.ENV_RELOCATE_INSTEAD_OF_WAIT] = "true"
    if relocation_wait_seconds is not None:
        env[C.ENV_RELOCATION_WAIT_SECONDS] = str(relocation_wait_seconds)
    if spare_nodes is not None:
        env[C.ENV_SPARE_NODES] = spare_nodes
    if lend_spares:
        env[C.ENV_LEND_SPARES] = "true"
    with build_world(duplicate_delivery=duplicate_delivery, sim_options=sim_options,
                     max_recovery_attempts=max_recovery_attempts, extra_env=env,
                     training_family="train", training_run_seconds=60 * MIN) as built:
        yield built


def _finish(w: World, name: str, title: str, problems: list[str], job_ids: list[str],
            facts: dict[str, Any] | None = None) -> ScenarioResult:
    if w.bus.dead_letters:
        problems.append(f"{len(w.bus.dead_letters)} event(s) in a DLQ")
    return ScenarioResult(
        name=name, title=title, problems=problems,
        jobs={j: w.job(j) for j in job_ids},
        fault_records={j: w.fault_records(j) for j in job_ids},
        nodes={n: w.node_item(n) for n in sorted(w.ecs.nodes)},
        counters=w.ecs.summary(), notifications=w.aws.notifications(),
        timeline=w.ecs.format_timeline(), facts=facts or {})


def _expect(problems: list[str], what: str, got: Any, want: Any) -> None:
    if got != want:
        problems.append(f"{what}: {got!r} (want {want!r})")


def _relocatable(job_id: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {C.TAG_RELOCATABLE: "true", **(extra or {})}


# ---------------------------------------------------------------------- scenarios
def _two_node_job(w: World, job_id: str) -> None:
    """node-a and node-b, and a training job with a rank on each."""
    for node in ("node-a", "node-b"):
        w.ecs.add_node(node)
    w.ecs.start_job(job_id, w.training_task_definition, ["node-a", "node-b"])


def fast_path() -> ScenarioResult:
    """XID 79 on rank 1's GPU: reboot without the DCGM diag; the job restarts and completes."""
    title = "fast path: XID 79 -> reboot without the DCGM diag -> job restarted and COMPLETE"
    with world() as w:
        _two_node_job(w, "llama-fp")
        w.ecs.inject_xid("node-b", 79, after=10 * MIN, nccl_cascade=True)
        w.ecs.run_for(16 * MIN)
        restarted = w.job("llama-fp")
        mttr = _restart_seconds(restarted)
        w.ecs.run_for(70 * MIN)
        problems: list[str] = []
        job = w.job("llama-fp")
        _expect(problems, "job", (job.get("job_state"), job.get("attempt")), ("COMPLETE", 2))
        _expect(problems, "health checks", w.ecs.counters["health_checks_started"], 0)
        _expect(problems, "reboots of node-b", w.ecs.node("node-b").reboots, 1)
        node_b = w.ecs.node("node-b").container_instance_id
        verdict = (w.fault_records("llama-fp").get(1, {}).get(node_b) or {}).get("findings") or {}
        _expect(problems, "decision", (verdict.get("source"), verdict.get("rule")), ("fast path", "xid-79"))
        return _finish(w, "fast_path", title, problems, ["llama-fp"], {"fault_to_running_seconds": mttr})


def gpu_reset() -> ScenarioResult:
    """A row remap pending: DCGM says reset, the reset task resets node-b's GPUs, no reboot."""
    title = ("GPU reset: a row remap pending -> DCGM says reset -> node-b's GPUs reset in place "
             "(no reboot) -> job restarted and COMPLETE")
    with world() as w:
        _two_node_job(w, "gpt-reset")
        w.ecs.inject_gpu_fault("node-b", after=10 * MIN, health="reset_fixable", nccl_cascade=True)
        w.ecs.run_for(16 * MIN)
        mttr = _restart_seconds(w.job("gpt-reset"))
        w.ecs.run_for(70 * MIN)
        problems: list[str] = []
        job = w.job("gpt-reset")
        _expect(problems, "job", (job.get("job_state"), job.get("attempt")), ("COMPLETE", 2))
        _expect(problems, "GPU resets / reboots of node-b",
                (w.ecs.counters.get("gpu_resets_started", 0), w.ecs.node("node-b").reboots), (1, 0))
        history = [r["action"] for r in w.node_item("node-b").get("fault_history", [])]
        _expect(problems, "node-b fault history", history, ["reset_gpu"])
        _expect(problems, "fallback e-mails", len(_kinds(w, C.NotificationKind.GPU_RESET_FAILED.value)), 0)
        return _finish(w, "gpu_reset", title, problems, ["gpt-reset"], {"fault_to_running_seconds": mttr})


def flapping() -> ScenarioResult:
    """The same node faults three times: reboot, reboot, then replace; charged once."""
    title = ("flapping node: XID 79 three times -> rebooted twice, replaced (drained) on its 3rd "
             "fault; the job charged once and relocated to a spare")
    with world() as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        w.ecs.start_job("bert-flap", w.training_task_definition, ["node-a", "node-b"],
                        extra_tags=_relocatable("bert-flap", {C.TAG_MAX_INFRA_RECOVERIES: "1"}))
        for minutes in (10, 30, 50):
            w.ecs.inject_xid("node-b", 79, after=minutes * MIN, health="persistent_reboot", nccl_cascade=True)
        w.ecs.run_for(60 * MIN)
        during = w.ranks_on("bert-flap")
        w.ecs.run_for(70 * MIN)
        problems: list[str] = []
        job = w.job("bert-flap")
        _expect(problems, "job", (job.get("job_state"), job.get("attempt"), job.get("recoveries_used")),
                ("COMPLETE", 4, 1))
        _expect(problems, "reboots of node-b", w.ecs.node("node-b").reboots, 2)
        _expect(problems, "node-b", w.node_item("node-b").get("instance_state"), "QUARANTINED")
        history = [(r["action"], r["charged_job"]) for r in w.node_item("node-b").get("fault_history", [])]
        _expect(problems, "node-b fault history", history,
                [("reboot", True), ("reboot", False), ("replace", False)])
        _expect(problems, "ranks after the 3rd fault", during, ["node-a", "node-c"])
        return _finish(w, "flapping", title, problems, ["bert-flap"])


def relocation() -> ScenarioResult:
    """A dead GPU (DCGM replace): the node is quarantined, rank 1 moves to the spare."""
    title = "dead GPU: DCGM says replace -> node quarantined, rank moved to a spare node -> COMPLETE"
    with world() as w:
        for node in ("node-a", "node-b", "node-c"):
            w.ecs.add_node(node)
        w.ecs.start_job("gpt-dead", w.training_task_definition, ["node-a", "node-b"],
                        extra_tags=_relocatable("gpt-dead"))
        w.ecs.inject_gpu_fault("node-b", after=10 * MIN, health="replace", nccl_cascade=True)
        w.ecs.run_for(20 * MIN)
        during = w.ranks_on("gpt-dead")
        restarted = w.job("gpt-dead")
        w.ecs.run_for(70 * MIN)
        problems: list[str] = []
        job = w.job("gpt-dead")
        _expect(problems, "job", (job.get("job_state"), job.get("attempt")), ("COMPLETE", 2))
        _expect(problems, "ranks after relocation", during, ["node-a", "node-c"])
        _expect(problems, "reboots", w.ecs.counters["reboots"], 0)
        _expect(problems, "node-b", w.node_item("node-b").get("instance_state"), "QUARANTINED")
        moves = [m.get("moves") for m in job.get("relocations", [])]
        want = {w.ecs.node("node-b").container_instance_id: w.ecs.node("node-c").container_instance_id}
        _expect(problems, "relocation record", moves, [want])
        return _finish(w, "relocation", title, problems, ["gpt-dead"],
                       {"fault_to_running_seconds": _restart_seconds(restarted)})


def breaker() -> ScenarioResult:
    """4 of 16 nodes fault within 10 minutes: the 4th trips the breaker."""
    title = ("blast-radius breaker: 4 of 16 nodes fault within 10 min -> 3 rebooted, the 4th trips "
             "the breaker (notified once, backlog kept), nothing more rebooted, the jobs on held nodes "
             "wait HELD; reset resumes it and they restart")
    from gpu_recovery.recovery.breaker.operations import reset_breaker

    with world() as w:
        faulty = ["node-01", "node-03", "node-05", "node-07", "node-09"]
        nodes, jobs = _storm(w, faulty)
        w.ecs.run_for(25 * MIN)
        rebooted = [n for n in nodes if w.ecs.node(n).reboots]
        state = w.repo.breaker.read() or {}
        held = sorted(w.node_name(b["node"]) for b in state.get("backlog", []))
        trips = [n for n in w.aws.notifications()
                 if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "breaker_tripped"]
        problems: list[str] = []
        _expect(problems, "rebooted before the reset", rebooted, faulty[:3])
        _expect(problems, "breaker", (state.get("state"), state.get("trips")), ("tripped", 1))
        _expect(problems, "backlog", held, faulty[3:])
        _expect(problems, "breaker e-mails", len(trips), 1)
        _expect(problems, "held nodes", sorted(w.node_item(n).get("instance_state") for n in faulty[3:]),
                ["SUSPECT", "SUSPECT"])
        # The jobs on the held nodes cannot move (no relocatable tag): they wait, uncharged.
        on_held = ["job-3", "job-4"]
        waiting = {j: (w.job(j).get("job_state"), w.job(j).get("recoveries_used")) for j in on_held}
        _expect(problems, "jobs on held nodes", waiting, {j: ("HELD", 0) for j in on_held})
        # The operator resets the breaker and resumes its backlog: the sweep carries it out.
        reset_at = w.ecs.now()
        reset = reset_breaker(w.repo.breaker, now=reset_at, resume_backlog=True, by="demo-operator")
        w.ecs.run_for(10 * MIN)
        after = sorted(n for n in nodes if w.ecs.node(n).reboots)
        _expect(problems, "reset", reset.done, True)
        _expect(problems, "rebooted after the reset", after, faulty)
        _expect(problems, "held nodes back", sorted(w.node_item(n).get("instance_state") for n in faulty[3:]),
                ["AVAILABLE", "AVAILABLE"])
        restarted = {j: (w.job(j).get("job_state"), w.job(j).get("attempt"), w.job(j).get("recoveries_used"),
                         w.ranks_on(j)) for j in on_held}
        _expect(problems, "held jobs after the reset", restarted,
                {"job-3": ("RUNNING", 2, 1, ["node-06", "node-07"]),
                 "job-4": ("RUNNING", 2, 1, ["node-08", "node-09"])})
        # Nothing placed on a node while it was held (its fault until the reset) or while it
        # rebooted; no job failed for a node already known to be bad.
        first_held = (10 + 2 * 3) * MIN
        placed = sorted(f"{t.tags.get(C.TAG_JOB_ID)} on {t.node}" for t in w.ecs.tasks.values()
                        if not t.health_check and t.node in faulty[3:]
                        and w.ecs.clock.offset(first_held) < t.created_at < reset_at)
        _expect(problems, "tasks placed on held nodes", placed, [])
        failed = [j for j in jobs if w.job(j).get("job_state") == "FAILED"]
        _expect(problems, "failed jobs", failed, [])
        return _finish(w, "breaker", title, problems, jobs,
                       {"trip_reason": state.get("trip_reason", ""), "backlog": held, "held_jobs": waiting,
                        "placed_on_held_nodes": placed, "reset_at": reset_at})


def _storm(w: World, faulty: Sequence[str] = ("node-01", "node-03", "node-05", "node-07")
           ) -> tuple[list[str], list[str]]:
    """16 nodes, 8 two-node jobs; XID 79 on each of ``faulty`` two minutes apart from minute
    10 (by default node-01, 03, 05, 07: three are rebooted, the 4th trips the breaker and
    job-3 waits HELD for node-07)."""
    nodes = [f"node-{i:02d}" for i in range(16)]
    for node in nodes:
        w.ecs.add_node(node)
    jobs = [f"job-{i}" for i in range(8)]
    for i, job_id in enumerate(jobs):
        w.ecs.start_job(job_id, w.training_task_definition, nodes[2 * i:2 * i + 2])
    for k, node in enumerate(faulty):
        w.ecs.inject_xid(node, 79, after=(10 + 2 * k) * MIN, nccl_cascade=True)
    return nodes, jobs


def _kinds(w: World, kind: str) -> list[dict[str, Any]]:
    return [n for n in w.aws.notifications() if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == kind]


def breaker_autoclose() -> ScenarioResult:
    """The storm of ``breaker`` with nobody to reset it: the rebooted nodes come back
    healthy, a window after the trip the breaker closes by itself and releases node-07's
    reboot; a reboot-fixable fault long after is rebooted at once, not HELD."""
    title = ("breaker closes by itself: the storm's 3 rebooted nodes back healthy -> a window after the "
             "trip it closes (one e-mail), node-07 rebooted, job-3 restarts; a later fault is rebooted")
    with world() as w:
        nodes, jobs = _storm(w)
        w.ecs.run_for(20 * MIN)
        problems: list[str] = []
        state = w.repo.breaker.read() or {}
        tripped_at = float(state.get("tripped_at") or 0)
        _expect(problems, "breaker at minute 20", state.get("state"), "tripped")
        _expect(problems, "job-3 while tripped", w.job("job-3").get("job_state"), "HELD")
        w.ecs.run_for(15 * MIN)  # the window (10 min) since the trip has passed
        state = w.repo.breaker.read() or {}
        _expect(problems, "breaker a window after the trip", (state.get("state"), state.get("last_reset_by")),
                ("closed", "the breaker itself (auto close)"))
        closed = _kinds(w, "breaker_closed")
        _expect(problems, "breaker_closed e-mails", len(closed), 1)
        said = "breaker closed by itself: nodes " + ", ".join(
            sorted(w.ecs.node(n).container_instance_id for n in ("node-01", "node-03", "node-05")))
        if closed and said not in str(closed[0]["message"]):
            problems.append(f"the e-mail does not say {said!r}")
        _expect(problems, "node-07 rebooted after the close", w.ecs.node("node-07").reboots, 1)
        # A reboot-fixable fault long after the storm: rebooted at once, its job recovers.
        w.ecs.inject_xid("node-11", 79, after=5 * MIN, nccl_cascade=True)
        w.ecs.run_for(15 * MIN)
        _expect(problems, "node-11 rebooted", w.ecs.node("node-11").reboots, 1)
        later = {j: (w.job(j).get("job_state"), w.job(j).get("attempt")) for j in ("job-3", "job-5")}
        _expect(problems, "job-3 and job-5", later, {"job-3": ("RUNNING", 2), "job-5": ("RUNNING", 2)})
        _expect(problems, "failed jobs", [j for j in jobs if w.job(j).get("job_state") == "FAILED"], [])
        _expect(problems, "breaker e-mails", (len(_kinds(w, "breaker_tripped")),
                                              len(_kinds(w, "breaker_needs_operator"))), (1, 0))
        _expect(problems, "breaker at the end", (w.repo.breaker.read() or {}).get("state"), "closed")
        return _finish(w, "breaker_autoclose", title, problems, jobs,
                       {"tripped_at": tripped_at, "closed_at": state.get("last_reset_at"),
                        "rebooted": sorted(n for n in nodes if w.ecs.node(n).reboots)})


def breaker_refault() -> ScenarioResult:
    """The storm of ``breaker``, and node-01, rebooted in it, faults again: the reboots did
    not fix it, so the breaker stays open until an operator resets it, and says so once."""
    title = ("breaker stays open: node-01, rebooted in the storm, faults again -> open until an operator "
             "resets it (one e-mail saying why), nothing more rebooted")
    from cli.admin import breaker_command

    with world() as w:
        _, jobs = _storm(w)
        w.ecs.inject_xid("node-01", 79, after=20 * MIN, nccl_cascade=True)
        w.ecs.run_for(50 * MIN)
        problems: list[str] = []
        state = w.repo.breaker.read() or {}
        node_01 = w.ecs.node("node-01").container_instance_id
        _expect(problems, "breaker", state.get("state"), "tripped")
        reason = str((state.get("needs_operator") or {}).get("reason") or "")
        if f"{node_01} failed again after its remediation" not in reason:
            problems.append(f"the breaker's reason is {reason!r} (want node-01 failed again)")
        mails = _kinds(w, "breaker_needs_operator")
        _expect(problems, "breaker_needs_operator e-mails", len(mails), 1)
        _expect(problems, "breaker_closed e-mails", len(_kinds(w, "breaker_closed")), 0)
        _expect(problems, "reboots", {n: w.ecs.node(n).reboots for n in ("node-01", "node-07")},
                {"node-01": 1, "node-07": 0})
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            breaker_command(argparse.Namespace(breaker_command="show", json=True), w.repo, w.ecs.now())
        shown = json.loads(out.getvalue())
        _expect(problems, "breaker show", (shown["standing"], shown["why"]),
                ("open until an operator resets it", reason))
        return _finish(w, "breaker_refault", title, problems, jobs,
                       {"needs_operator": reason, "show": shown["standing"]})


def observe() -> ScenarioResult:
    """Observe mode: detect, classify, record and notify; change nothing."""
    title = "observe mode: XID 79 detected and e-mailed with what would have been done; nothing done"
    with world(remediation={"remediation_mode": "observe"}) as w:
        _two_node_job(w, "vit-observe")
        w.ecs.inject_xid("node-b", 79, after=10 * MIN)
        w.ecs.run_for(30 * MIN)
        problems: list[str] = []
        counters = w.ecs.counters
        _expect(problems, "StopTask / reboots / health checks / terminations",
                (counters["stop_requests"], counters["reboots"], counters["health_checks_started"],
                 counters["terminations"]), (0, 0, 0, 0))
        ecs = w.aws.client("ecs")
        statuses = [ci["status"] for ci in ecs.describe_container_instances(
            cluster=w.aws.cluster_name,
            containerInstances=[w.ecs.node(n).container_instance_arn for n in ("node-a", "node-b")])[
            "containerInstances"]]
        _expect(problems, "container instances", statuses, ["ACTIVE", "ACTIVE"])
        _expect(problems, "rank 0 still running", w.ranks_on("vit-observe"), ["node-a"])
        observed = [n for n in w.aws.notifications()
                    if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "observed"]
        _expect(problems, "observe e-mails", len(observed), 1)
        said = "Would have done (not carried out): stop_tasks, reboot"
        if observed and said not in str(observed[0]["message"]):
            problems.append("the e-mail does not say what would have been done")
        history = w.node_item("node-b").get("fault_history", [])
        _expect(problems, "node-b record", [(r["action"], r["executed"]) for r in history],
                [("reboot", False)])
        return _finish(w, "observe", title, problems, ["vit-observe"])


def persistence_mode() -> ScenarioResult:
    """DCGM fails only on persistence mode (error 29): operator action, no reboot."""
    title = ("persistence mode off: DCGM error 29 (severity config) -> operator action, node drained, "
             "never rebooted")
    with world() as w:
        _two_node_job(w, "t5-config")
        w.ecs.inject_gpu_fault("node-b", after=10 * MIN, health="config_error", nccl_cascade=True)
        w.ecs.run_for(20 * MIN)
        problems: list[str] = []
        job = w.job("t5-config")
        _expect(problems, "job", job.get("job_state"), "FAILED")
        _expect(problems, "reboots", w.ecs.counters["reboots"], 0)
        _expect(problems, "health checks", w.ecs.counters["health_checks_started"], 1)
        _expect(problems, "node-b", w.node_item("node-b").get("instance_state"), "QUARANTINED")
        node_b = w.ecs.node("node-b").container_instance_id
        _expect(problems, "node-b verdict",
                (w.fault_records("t5-config").get(1, {}).get(node_b) or {}).get("label"), "OPERATOR_ACTION")
        mails = [n for n in w.aws.notifications()
                 if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == "operator_action"]
        _expect(problems, "operator e-mails", len(mails), 1)
        if mails and "DCGM error 29" not in str(mails[0]["message"]):
            problems.append("the e-mail lacks the DCGM evidence (error 29)")
        return _finish(w, "persistence_mode", title, problems, ["t5-config"])


SCENARIOS: dict[str, Callable[[], ScenarioResult]] = {
    "fast_path": fast_path,
    "gpu_reset": gpu_reset,
    "flapping": flapping,
    "relocation": relocation,
    "breaker": breaker,
    "breaker_autoclose": breaker_autoclose,
    "breaker_refault": breaker_refault,
    "observe": observe,
    "persistence_mode": persistence_mode,
}


def _restart_seconds(job: dict[str, Any]) -> float | None:
    """Fault -> every rank running again, from the job's history."""
    history = job.get("history") or []
    fault = next((h["at"] for h in history
                  if h.get("to") in ("PENDING_HEALTHCHECK", "PENDING_RESTART")), None)
    running = [h["at"] for h in history if h.get("to") == "RUNNING" and fault is not None and h["at"] > fault]
    return float(running[0] - fault) if running and fault is not None else None


def run_all(names: list[str] | None = None) -> list[ScenarioResult]:
    return [SCENARIOS[name]() for name in (names or list(SCENARIOS))]


def report(results: list[ScenarioResult]) -> list[str]:
    lines = ["Remediation scenarios (one per catalog class, each in its own simulated cluster)", "-" * 78]
    for result in results:
        lines.append(f"{'ok ' if result.ok else '!! '}{result.name:<17} {result.title}")
        for problem in result.problems:
            lines.append(f"     !! {problem}")
        kinds = ", ".join(sorted(set(result.kinds())))
        lines.append(f"     reboots {result.counters.get('reboots', 0)}, health checks "
                     f"{result.counters.get('health_checks_started', 0)}, StopTask "
                     f"{result.counters.get('stop_requests', 0)}, e-mails: {kinds or 'none'}")
        seconds = result.facts.get("fault_to_running_seconds")
        if seconds is not None:
            lines.append(f"     fault -> every rank running again: {seconds:.0f} s (simulated)")
    return lines
