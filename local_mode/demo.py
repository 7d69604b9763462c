"""`make demo`: watch GPU faults being recovered, on a laptop, in simulated time.

The same Lambda handlers that the stack deploys run against an embedded AWS
emulator (moto) and a simulated ECS data plane. Events are shaped as AWS documents
them, delivered at least once (every event twice) and routed by the deployed
EventBridge patterns. Recovery scenarios (jobs started directly on ECS):

1. a 2-node job whose rank 1 hits an ECC fault: health check, reboot, gang restart,
   then the job completes;
2. a job whose node a reboot does not fix: it faults again after the restart, is
   rebooted again (the fault catalog's escalation replaces it on its 3rd fault), and the
   job is not charged twice for the same flapping node: it completes;
3. a job whose health check says healthy: the failure was an application bug.

The REST API (node heartbeats + jobs queue) also runs, on 127.0.0.1 (an ephemeral
port, a thread of this process), against the same emulator. Every node runs a
simulated GPU node agent that POSTs ``/v1/report_tasks`` every 30 simulated seconds
over HTTP with its token; the heartbeat sweep and the queue scheduler run every
minute, and the scheduler also runs right after each submit / cancel (in process).
Jobs submitted through the API with the CLI's client (``cli/gpujobs/``):

4. two jobs that fit run concurrently; one of them loses a node's heartbeats for
   5 minutes (NODE_LOST, then RUNNING again), the other has a rank whose step stops
   advancing while it keeps heartbeating (HUNG, operators notified, then RUNNING);
5. a job recovered after a GPU fault (health check, reboot, gang restart);
6. a job that waits while the cluster is full (QUEUED), is admitted when gpt-neox
   ends, but one of its nodes is being rebooted (ECS still shows its agent connected):
   StartTask is refused, the job waits in PENDING_RESOURCES until GPUs free up;
7. a job canceled while it waits.

Then the remediation scenarios (``local_mode/remediation_scenarios.py``), one per class of
the fault catalog, each in its own simulated cluster: fast-path XID 79 reboot without the
diag; a flapping node escalated to replacement on its 3rd fault; a dead GPU relocated to a
spare node; the blast-radius breaker tripping when 4 of 16 nodes fault within 10 minutes
(the jobs on the held nodes wait HELD and restart after the reset), closing by itself
when the storm's rebooted nodes are back healthy, and staying open until an operator resets
it when one of them faults again; observe mode; a persistence-mode diag failure that needs
an operator, not a reboot.

Last, the time-sharing scenario (``local_mode/time_sharing_scenario.py``), in its own
4-node cluster with the local API over HTTP: an admin sets node quotas (PUT /v1/quotas);
alice's LOW job fills the cluster; bob's job (AUTO -> HIGH) preempts it; alice's rank 0, a
simulated program calling the real ``gpu_recovery_client`` every 2 s, is told within a
poll, saves a checkpoint and calls ``go_suspend()``; bob's job runs while his second HIGH
job waits on his quota with nodes free; alice's job resumes (``RESUME_COUNT=1``) from its
checkpoint and completes.

This demo's 12-node cluster reboots three nodes within ten minutes (scenarios 1, 2 and 5
overlap on purpose); its breaker allows 50 % of the nodes per window (the default, 20 %,
is shown tripping in the breaker scenario).

The run ends with one JSON line summarising what happened.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as C
from local_mode.harness import loopback_without_proxy, reset_handler_caches, silence_handler_logs

HANG_SECONDS = 600
MAX_SIMULATED_SECONDS = 4 * 60 * 60
TERMINAL_STATES = ("COMPLETE", "FAILED", "CANCELED", "USER_STOPPED")
QUEUE_NODES = ["node-g", "node-h", "node-i", "node-j"]


@dataclass
class Scenario:
    job_id: str
    title: str
    nodes: list[str]
    setup: Callable[[Any, list[str]], None]
    expected_state: str


@dataclass
class QueueScenario:
    """A job submitted through the jobs API; ``job_id`` is known once submitted."""

    name: str
    title: str
    nnodes: int
    run_minutes: float
    expected_state: str
    after_submit: Callable[[Any, QueueScenario, dict[str, Any]], None] | None = None
    job_id: str = ""
    spec: dict[str, Any] = field(default_factory=dict)


def outcome_line(label: str, state: str, expected: str, attempt: Any, recoveries: Any, title: str) -> str:
    """A job's line in the demo's outcome table: ``ok`` when it ended as its scenario means it
    to (a FAILED the scenario expects says so, so it does not read as the demo failing),
    ``!!`` and what was expected otherwise."""
    if state == expected:
        mark, shown = "ok ", state if state == "COMPLETE" else f"{state} (as expected)"
    else:
        mark, shown = "!! ", f"{state} (expected {expected})"
    return f"{mark}{label:<15} {shown:<22} attempt {attempt} recoveries {recoveries}  — {title}"

def _scenarios() -> list[Scenario]:
    def ecc_fault_recovered(sim: Any, tasks: list[str]) -> None:
        # Rank 1's GPU reports an uncorrectable ECC error 20 minutes in; the other rank
        # dies of NCCL errors a few seconds later (as real jobs do).
        sim.inject_gpu_fault("node-b", after=20 * 60, health="reboot_fixable", nccl_cascade=True)

    def node_still_bad(sim: Any, tasks: list[str]) -> None:
        # The reboot does not fix this GPU: it faults again after the restart. The node is
        # rebooted again (escalation replaces it only on its 3rd fault), and the job's single
        # recovery is not spent twice on the same flapping node.
        sim.inject_gpu_fault("node-d", after=15 * 60, health="persistent_reboot")
        sim.inject_gpu_fault("node-d", after=45 * 60, health="persistent_reboot")

    def application_bug(sim: Any, tasks: list[str]) -> None:
        # Rank 0 exits 1 on a perfectly healthy node: DCGM says healthy.
        sim.inject_task_exit(tasks[0], exit_code=1, after=10 * 60)

    return [
        Scenario("llama-ft", "2-node job, ECC fault on rank 1 -> recovered",
                 ["node-a", "node-b"], ecc_fault_recovered, "COMPLETE"),
        Scenario("bert-pretrain", "node faults again after its reboot -> rebooted again, job "
                 "charged once -> COMPLETE", ["node-c", "node-d"], node_still_bad, "COMPLETE"),
        Scenario("resnet-sweep", "health check healthy -> application error",
                 ["node-e", "node-f"], application_bug, "FAILED"),
    ]


def _queue_scenarios() -> list[QueueScenario]:
    """Submitted in this order at the start; the cluster then has no free node."""

    def node_goes_silent(d: Any, q: QueueScenario, job: dict[str, Any]) -> None:
        node = d.node_of(job, rank=1)
        d.agents.silence(node, d.t0 + 20 * 60, d.t0 + 25 * 60, label=q.name)

    def rank_hangs(d: Any, q: QueueScenario, job: dict[str, Any]) -> None:
        d.agents.freeze_steps(q.job_id, 0, d.t0 + 8 * 60, d.t0 + 30 * 60, label=q.name)

    def gpu_fault(d: Any, q: QueueScenario, job: dict[str, Any]) -> None:
        d.sim.inject_gpu_fault(d.node_of(job, rank=0), after=15 * 60, health="reboot_fixable")

    def start_race(d: Any, q: QueueScenario, job: dict[str, Any]) -> None:
        # gpt-neox ends at 14:40:05; the next tick (14:41:00) admits this job onto the 4
        # free nodes. node-e is rebooted for maintenance at 14:40:50: ECS still shows its
        # agent connected (it disconnects 15 s later), so the tick picks it and StartTask
        # is refused (RESOURCE:GPU): the job goes to PENDING_RESOURCES and starts once
        # node-e is back and 4 nodes have free GPUs again.
        def maintenance() -> None:
            d.note(q.name, "operator reboots node-e for maintenance (ECS shows its agent "
                   "connected for 15 s more)", node="node-e")
            d.sim.reboot("node-e")

        d.sim.schedule(d.t0 + 40 * 60 + 50, maintenance, "maintenance reboot")

    def cancel_while_waiting(d: Any, q: QueueScenario, job: dict[str, Any]) -> None:
        d.sim.schedule(d.t0 + 5 * 60, lambda: d.cancel(q), "cancel")

    return [
        QueueScenario("gpt-neox", "queue: runs concurrently; a node goes silent 5 min -> "
                      "NODE_LOST -> RUNNING", 2, 40, "COMPLETE", node_goes_silent),
        QueueScenario("vit-huge", "queue: runs concurrently; rank 0 stops advancing -> HUNG "
                      "(notified) -> RUNNING", 1, 50, "COMPLETE", rank_hangs),
        QueueScenario("mistral-ft", "queue: GPU fault -> health check, reboot, gang restart",
                      1, 30, "COMPLETE", gpu_fault),
        QueueScenario("mixtral-moe", "queue: waits (cluster full); StartTask refused -> "
                      "PENDING_RESOURCES until GPUs free up", 4, 20, "COMPLETE", start_race),
        QueueScenario("bloom-sweep", "queue: canceled while waiting", 2, 20, "CANCELED",
                      cancel_while_waiting),
    ]


def _job_history(local: Any, job_id: str) -> dict[str, Any]:
    table = local.client("dynamodb")
    item = table.get_item(
        TableName=C.DEFAULT_JOB_TABLE_NAME,
        Key={C.JOB_PK: {"S": C.job_item_key(job_id)}},
        ConsistentRead=True,
    ).get("Item")
    if not item:
        return {}
    from boto3.dynamodb.types import TypeDeserializer

    from gpu_recovery.repository import from_ddb

    deserializer = TypeDeserializer()
    return from_ddb({k: deserializer.deserialize(v) for k, v in item.items()})


class _QueueDriver:
    """The API-side actors of the demo: the CLI client, the node agents, the timeline."""

    def __init__(self, sim: Any, client: Any, agents: Any) -> None:
        self.sim = sim
        self.client = client
        self.agents = agents
        self.t0 = sim.now()
        self.timeline: list[tuple[float, str, str, str]] = []  # (time, label, node, text)
        self.api_errors: list[str] = []

    def node_of(self, job: dict[str, Any], rank: int) -> str:
        ci = next(r["container_instance_id"] for r in job.get("ranks", []) if r["rank"] == rank)
        return str(self.sim.node(ci).name)

    def note(self, label: str, text: str, node: str = "api") -> None:
        self.timeline.append((self.sim.now(), label, node, text))

    def submit(self, q: QueueScenario, task_definition: str) -> dict[str, Any]:
        q.spec = {"name": q.name, "task_definition": task_definition, "nnodes": q.nnodes,
                  "gpus_per_node": 8, "max_recovery_attempts": 1}
        created = self.client.submit(q.spec, idempotency_key=f"demo-{q.name}")
        q.job_id = created["job_id"]
        job = self.client.get_job(q.job_id)
        self.note(q.name, f"POST /v1/jobs {q.name} ({q.nnodes}x8 GPUs) -> 201 job {q.job_id}; "
                  f"after the scheduler tick: {job['state']}")
        return job

    def cancel(self, q: QueueScenario) -> None:
        try:
            out = self.client.cancel(q.job_id)
            self.note(q.name, f"POST /v1/jobs/{q.name}/cancel -> {out.get('previous_state')} -> "
                      f"{out.get('state')}")
        except Exception as error:  # shown and counted, never fatal
            self.api_errors.append(f"cancel {q.name}: {error}")


class _StdoutWithoutEmf:
    """Powertools prints EMF metric lines to stdout (CloudWatch Logs in Lambda), even
    with metrics disabled once a metric holds 100 values. While the handlers run,
    stdout is captured; :meth:`release` restores it and passes on everything else."""

    def __init__(self) -> None:
        self._saved: Any = None
        self._buffer = io.StringIO()

    def __enter__(self) -> _StdoutWithoutEmf:
        self._saved, sys.stdout = sys.stdout, self._buffer
        return self

    def release(self) -> None:
        if self._saved is None:
            return
        sys.stdout, self._saved = self._saved, None
        for line in self._buffer.getvalue().splitlines():
            if line.strip() and not line.startswith('{"_aws"'):
                print(line)

    def __exit__(self, *exc: Any) -> None:
        self.release()


def run(*, duplicate_delivery: bool = True, quiet: bool = False,
        details: dict[str, Any] | None = None) -> dict[str, int]:
    """Run every scenario; returns the JSON summary. ``details`` (if given) is filled
    with job items, notifications, dead letters and API/agent errors (for tests)."""
    warnings.filterwarnings("ignore")
    from cli.gpujobs import ApiClient
    from local_mode.node_agents import SimulatedNodeAgents
    from local_mode.server import LocalApi, LocalApiServer
    from local_mode.world import build_world

    out = (lambda *_a, **_k: None) if quiet else print
    started = time.perf_counter()
    scenarios = _scenarios()
    queue = _queue_scenarios()
    trigger_failures: list[str] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(loopback_without_proxy())
        emf = stack.enter_context(_StdoutWithoutEmf())
        # Before the emulator (it resets the boto3 session) and after it: the handlers'
        # cached services must be built on the emulator's hooked session.
        reset_handler_caches()
        stack.callback(reset_handler_caches)
        world = stack.enter_context(build_world(
            duplicate_delivery=duplicate_delivery, sweep_every_seconds=60,
            max_recovery_attempts=1, reboot_timeout_minutes=15,
            heartbeat_stale_seconds=180, node_lost_fail_seconds=1800,
            hang_seconds=HANG_SECONDS, hang_action="notify",
            extra_env={"POWERTOOLS_LOG_LEVEL": "CRITICAL",
                       C.ENV_REMEDIATION_SETTINGS: json.dumps({"breaker_max_percent": 50})},
        ))
        silence_handler_logs()
        local, bus, sim = world.aws, world.bus, world.ecs
        world.schedule_heartbeat_sweep(60)
        world.schedule_queue_scheduler(60)
        world.invoke_scheduler_in_process(
            lambda error: trigger_failures.append(f"{type(error).__name__}: {error}"))
        td = sim.register_training_task_definition("train", gpus=8)
        # Every training rank runs for an hour, then exits 0 (restarted ranks too).
        sim.plan_family("train", run_seconds=60 * 60, exit_code=0)
        for scenario in scenarios:
            for node in scenario.nodes:
                sim.add_node(node, gpus=8, kind="anywhere" if node == "node-d" else "ec2")
            tasks = sim.start_job(scenario.job_id, td, scenario.nodes)
            scenario.setup(sim, tasks)
        for node in QUEUE_NODES:
            sim.add_node(node, gpus=8)

        server = stack.enter_context(LocalApiServer(LocalApi()))
        agents = SimulatedNodeAgents(sim, server.url, interval=30)
        agents.start()
        client = ApiClient(server.url, local_user="demo", timeout=30)
        driver = _QueueDriver(sim, client, agents)
        for q in queue:
            # One task definition per job, so each has its own simulated run time.
            family = f"train-{q.name}"
            arn = sim.register_training_task_definition(family, gpus=8)
            sim.plan_family(family, run_seconds=q.run_minutes * 60, exit_code=0)
            job = driver.submit(q, arn)
            if q.after_submit:
                q.after_submit(driver, q, job)

        job_ids = [s.job_id for s in scenarios] + [q.job_id for q in queue]
        limit = sim.now() + MAX_SIMULATED_SECONDS
        while sim.now() < limit:
            sim.run_for(min(600, limit - sim.now()))
            states = [_job_history(local, j).get("job_state") for j in job_ids]
            if all(s in TERMINAL_STATES for s in states):
                break
        simulated_minutes = (sim.now() - driver.t0) / 60

        jobs = {j: _job_history(local, j) for j in job_ids}
        listed = client.list_jobs(limit=20).get("jobs", [])
        notifications = local.notifications()
        summary_sim = sim.summary()
        labels = {s.job_id: s.job_id for s in scenarios} | {q.job_id: q.name for q in queue}
        emf.release()

        out("GPU training recovery — local mode (moto + simulated ECS, simulated time)")
        out("=" * 78)
        out(f"every event delivered {'twice (at-least-once)' if duplicate_delivery else 'once'}; "
            "handlers routed by the deployed EventBridge patterns")
        out(f"local API on {server.url}: node agents report every 30 s (Bearer token per node), "
            "jobs submitted with the gpujobs client; heartbeat sweep + queue scheduler every 60 s\n")
        out("\n".join(_merged_timeline(sim, jobs, labels, scenarios, driver, agents)))
        out("\nOutcome per job")
        out("-" * 78)
        rows = [(s.job_id, s.job_id, s.expected_state, s.title) for s in scenarios]
        rows += [(q.job_id, q.name, q.expected_state, q.title) for q in queue]
        for job_id, label, expected, title in rows:
            job = jobs[job_id]
            state = job.get("job_state", "?")
            out(outcome_line(label, state, expected, job.get("attempt", 0), job.get("recoveries_used", 0),
                             title))
            if job.get("last_error") and state not in ("COMPLETE", "CANCELED"):
                out(f"    last error: {job['last_error']}")
        out("\nJobs API (GET /v1/jobs through the CLI client)")
        out("-" * 78)
        for row in listed:
            out(f"{row['name']:<15} {row['state']:<10} {row['nnodes']}x{row['gpus_per_node']} GPUs  "
                f"{row['job_id']}")
        out(f"node agents: {agents.results.accepted} reports accepted over HTTP, "
            f"{len(agents.results.rejected)} rejected")
        out("\nNotifications (SNS)")
        out("-" * 78)
        for note in notifications:
            out(f"[{note['attributes'].get(C.NOTIFICATION_KIND_ATTRIBUTE, '?')}] {note['subject']}")
        if bus.dead_letters:
            out(f"\n!! {len(bus.dead_letters)} event(s) would have gone to a DLQ")
        for problem in trigger_failures + driver.api_errors:
            out(f"!! {problem}")
        for at, node, status, error in agents.results.rejected[:5]:
            out(f"!! {sim.clock.hms(at)} {node} report rejected ({status}): {error[:200]}")
        states = [j.get("job_state") for j in jobs.values()]
        summary = {
            "jobs": len(jobs),
            "completed": states.count("COMPLETE"),
            "recovered": sum(
                1 for n in notifications
                if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == C.NotificationKind.RECOVERED.value
            ),
            "failed": states.count("FAILED"),
            "reboots": int(summary_sim.get("reboots", 0)),
            "health_checks": int(summary_sim.get("health_checks_started", 0)),
            "notifications": len(notifications),
        }
        if details is not None:
            details.update(
                jobs=jobs, labels=labels, notifications=notifications,
                dead_letters=list(bus.dead_letters), trigger_failures=list(trigger_failures),
                api_errors=list(driver.api_errors), agent_rejections=list(agents.results.rejected),
                agent_reports=agents.results.accepted, listed=listed, api_url=server.url,
                queue={q.name: q.job_id for q in queue}, simulated_minutes=simulated_minutes,
                t0=driver.t0,
            )
        out(f"\n(simulated {simulated_minutes:.0f} minutes in {time.perf_counter() - started:.1f} s wall)")
    return summary


_JOB_IN_TEXT = re.compile(r"\bjob ([A-Za-z0-9._-]+)")


def _merged_timeline(sim: Any, jobs: dict[str, dict[str, Any]], labels: dict[str, str],
                     scenarios: list[Scenario], driver: _QueueDriver, agents: Any) -> list[str]:
    """Infrastructure events from the simulator, the node agents and the API calls,
    interleaved with job state changes; each line labelled with its job (scenario)."""
    owner = {node: s.job_id for s in scenarios for node in s.nodes}
    ended = {job_id: max((float(h.get("at", 0)) for h in job.get("history", [])
                          if h.get("to") in TERMINAL_STATES), default=float("inf"))
             for job_id, job in jobs.items()}
    short = {job_id: name for job_id, name in labels.items() if job_id != name}

    def shorten(text: str) -> str:
        for job_id, name in short.items():
            text = text.replace(job_id, name)
        return text

    def label_of(text: str, node: str, at: float) -> str:
        match = _JOB_IN_TEXT.search(text)
        if match and match.group(1) in labels:
            return labels[match.group(1)]
        job = owner.get(node, "")
        return job if job and at <= ended.get(job, float("inf")) else ""

    entries: list[tuple[float, int, str]] = []
    for seq, (at, kind, text) in enumerate(sim.timeline):
        if kind in ("schedule",):
            continue
        node = text[:8].strip()
        entries.append((at, seq, f"{sim.clock.hms(at)}  {label_of(text, node, at):<13} {shorten(text)}"))
    base = len(sim.timeline)
    for seq, (at, node, text, label) in enumerate(agents.timeline):
        label = label or label_of(text, node, at)
        entries.append((at, base + seq, f"{sim.clock.hms(at)}  {label:<13} {node:<8}  {shorten(text)}"))
    base += len(agents.timeline)
    for seq, (at, label, node, text) in enumerate(driver.timeline):
        entries.append((at, base + seq, f"{sim.clock.hms(at)}  {label:<13} {node:<8}  {shorten(text)}"))
    for job_id, job in jobs.items():
        for entry in job.get("history", []):
            at = float(entry.get("at", 0))
            line = (f"{sim.clock.hms(at)}  {labels.get(job_id, job_id):<13} {'':<8}  job -> "
                    f"{entry.get('to')}: {shorten(str(entry.get('reason')))}")
            entries.append((at, 10**9, line))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [text for _, _, text in entries]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--once", action="store_true", help="deliver every event once (default: twice)")
    parser.add_argument("--quiet", action="store_true", help="print only the JSON summary")
    parser.add_argument("--skip-remediation", action="store_true",
                        help="skip the remediation scenarios (one simulated cluster each)")
    parser.add_argument("--skip-time-sharing", action="store_true",
                        help="skip the time-sharing scenario (quotas, preemption, suspend, resume)")
    args = parser.parse_args(argv)
    summary: dict[str, Any] = dict(run(duplicate_delivery=not args.once, quiet=args.quiet))
    ok = True
    if not args.skip_remediation:
        from local_mode import remediation_scenarios

        reset_handler_caches()
        started = time.perf_counter()
        with _StdoutWithoutEmf() as emf:
            results = remediation_scenarios.run_all()
            emf.release()
        if not args.quiet:
            print()
            print("\n".join(remediation_scenarios.report(results)))
            print(f"(remediation scenarios: {time.perf_counter() - started:.1f} s wall)")
        ok = all(r.ok for r in results)
        summary["remediation_scenarios"] = f"{sum(r.ok for r in results)}/{len(results)} as described"
    if not args.skip_time_sharing:
        from local_mode import time_sharing_scenario

        with _StdoutWithoutEmf() as emf:  # its own emulator; it resets the handlers' caches
            outcome = time_sharing_scenario.run(duplicate_delivery=not args.once)
            emf.release()
        if not args.quiet:
            print()
            print("\n".join(time_sharing_scenario.report(outcome)))
        ok = ok and outcome.ok
        summary["time_sharing"] = "as described" if outcome.ok else f"{len(outcome.problems)} problem(s)"
    from local_mode.sim.contract.grants import recorded_denials

    for denial in sorted({str(d) for d in recorded_denials()}):  # what AWS would have refused
        print(f"!! {denial}")
        ok = False
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
