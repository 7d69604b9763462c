"""`make bench BENCH=scale`: one GPU fault on large jobs (issue 18), in the scale simulator.

A tag-registered job runs on exactly its nodes (plus ``SCALE_SPARES`` idle ones): one task
per node (8 GPUs each) or one task per GPU (8 per node). Its registration (every rank's
RUNNING event, each delivered twice) is set-up, measured on its own. Then node 0's GPU
fails (its tasks exit 1, the node's DCGM check says reboot) and

* ``cascade``: every other rank exits 1 too, within ``SCALE_CASCADE_SECONDS`` (5) of the
  fault, in random order (NCCL errors);
* ``all-nodes``: ``health_check_all_nodes`` on, no cascade (the system stops the peers).

The simulation runs until every rank of the next attempt is RUNNING (or the job ends) and
five more minutes (late duplicates, Lambda retries, dead letters), with a wall-clock cap
per scenario. Every figure is of the recovery alone (from the fault on).

The recovery code is the real one (``RecoveryService``, the ``Repository``, the adapters);
DynamoDB, ECS, EC2, SNS, CloudWatch Logs, Lambda and EventBridge are the simulator's
(``local_mode/sim/``, docs/benchmarks.md "Large jobs (scale)").

First, registration lines (issue 28): a job's tasks all RUNNING in the same second (1,024
and 8,192), registered by the convention or by tags alone, and mixed-cluster lines (1,000
unprotected task starts and stops, ``registration`` = convention / both):
``SCALE_REGISTRATION`` (sizes, "0": none), ``SCALE_REGISTRATION_BY``, ``SCALE_MIXED``.

Environment: ``SCALE_SIZES`` (tasks per job, default 8,64,256,1024 one per node and 8192 one
per GPU), ``SCALE_LAYOUTS`` (per-node,per-gpu), ``SCALE_SCENARIOS`` (cascade,all-nodes),
``SCALE_WALL_SECONDS`` (cap per scenario, default 600), ``SCALE_SEED``, ``SCALE_SPARES``,
``SCALE_SETTINGS`` (recovery ``Settings`` fields to override, as JSON),
``SCALE_PARTITIONS=1`` (DynamoDB's per-partition limits modelled: ``local_mode.sim.dynamo.throughput``),
``SCALE_SETUP_READS_UNLIMITED=1`` (the registration set-up runs without the account's
Describe/List limit, which a job of thousands of tasks registering at once exceeds: its
registration is then not measured at the real limits, but its recovery can be).
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain import rate_limit
from gpu_recovery.domain.launch_plan import MAX_INSTANCES_PER_START
from local_mode.scale_recovery import INSTANCE_TABLE, JOB_TABLE, ScaleWorld, TaggedJob, launch_tagged_job
from local_mode.sim.aws_calls import AccountRateLimit
from local_mode.world import build_world

DEFAULT_SIZES = {"per-node": (8, 64, 256, 1024), "per-gpu": (8192,)}
SCENARIOS = ("cascade", "all-nodes")
GPUS_PER_NODE = 8
SETUP_LIMIT_SECONDS = 1800.0  # simulated: registration of the job before the fault
SETTLE_SECONDS = 120.0  # after registration, before the fault
RECOVERY_LIMIT_SECONDS = 3 * 3600.0  # simulated, from the fault
MARGIN_SECONDS = 300.0  # after the outcome: duplicates, Lambda retries, dead letters
TERMINAL = {s.value for s in C.TERMINAL_JOB_STATES}
CONTROL_PLANE = ("RunTask", "StartTask", "StopTask", "UpdateContainerInstancesState")


def _env_list(name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = os.environ.get(name, "").strip()
    return tuple(v.strip() for v in raw.split(",") if v.strip()) if raw else default


def plan() -> list[tuple[str, int, str]]:
    """(layout, tasks, scenario) to run, from the environment."""
    layouts = _env_list("SCALE_LAYOUTS", ("per-node", "per-gpu"))
    scenarios = _env_list("SCALE_SCENARIOS", SCENARIOS)
    sizes_env = _env_list("SCALE_SIZES", ())
    runs = []
    for layout in layouts:
        if layout not in DEFAULT_SIZES:
            raise ValueError(f"SCALE_LAYOUTS: unknown layout {layout!r} (per-node, per-gpu)")
        sizes = tuple(int(s) for s in sizes_env) if sizes_env else DEFAULT_SIZES[layout]
        for size in sizes:
            if layout == "per-gpu" and size % GPUS_PER_NODE:
                raise ValueError(f"SCALE_SIZES: {size} tasks of 1 GPU do not fill whole 8-GPU nodes")
            for scenario in scenarios:
                if scenario not in SCENARIOS:
                    raise ValueError(f"SCALE_SCENARIOS: unknown scenario {scenario!r} "
                                     f"({', '.join(SCENARIOS)})")
                runs.append((layout, size, scenario))
    return runs


class _Registration:
    """Which ranks have a rank item yet (peeks only the missing ones)."""

    def __init__(self, world: ScaleWorld, job: TaggedJob) -> None:
        self.world = world
        self.job = job
        self.missing = set(range(job.world_size))

    def done(self) -> bool:
        for rank in list(self.missing):
            key = {C.JOB_PK: C.rank_item_key(self.job.job_id, rank)}
            if self.world.dynamo.peek_attributes(JOB_TABLE, key, ("rank",)) is not None:
                self.missing.discard(rank)
        return not self.missing


def _job_fields(world: ScaleWorld, job_id: str) -> dict[str, Any]:
    return world.dynamo.peek_attributes(JOB_TABLE, {C.JOB_PK: C.job_item_key(job_id)},
                                        ("job_state", "attempt", "last_error")) or {}


def _partitions(throughput: Any) -> dict[str, Any]:
    """``SCALE_PARTITIONS=1``: the busiest partition's write units in a second and the calls
    refused for a partition over DynamoDB's limits (none without the model)."""
    if throughput is None:
        return {}
    where, units = throughput.busiest()
    return {"busiest_partition_wcu_per_second": units, "busiest_partition": "/".join(map(str, where or ())),
            "throttled": dict(throughput.throttled)}


@contextmanager
def _collector_for_a_run() -> Iterator[None]:
    """The cyclic garbage collector, cheaper for a run (a tenth of a large one's CPU) and the
    run the same: what lives before it (modules, botocore's models) is frozen out of every
    collection, the youngest generation collected every 50,000 allocations (not 700), so the
    older ones (a large job's world) are traversed far less often. Only *when* cyclic garbage
    is reclaimed changes, nothing the simulation computes; both are restored after the run."""
    threshold = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def run_scenario(layout: str, size: int, scenario: str, *, seed: int = 20261120, spares: int = 2,
                 wall_cap: float = 600.0, cascade_seconds: float = 5.0,
                 settings: dict[str, Any] | None = None, lift_setup_reads: bool = False) -> dict[str, Any]:
    with _collector_for_a_run():
        return _run_scenario(layout, size, scenario, seed, spares, wall_cap, cascade_seconds, settings,
                             lift_setup_reads)


def _run_scenario(layout: str, size: int, scenario: str, seed: int, spares: int, wall_cap: float,
                  cascade_seconds: float, settings: dict[str, Any] | None,
                  lift_setup_reads: bool) -> dict[str, Any]:
    started = time.perf_counter()
    per_gpu = layout == "per-gpu"
    node_count = size // GPUS_PER_NODE if per_gpu else size
    out: dict[str, Any] = {"layout": layout, "tasks": size, "nodes": node_count, "spares": spares,
                           "scenario": scenario, "seed": seed}
    if settings:
        out["settings"] = dict(settings)
    overrides = {"check_all_nodes_on_fault": scenario == "all-nodes", **(settings or {})}
    world = build_world(backend="scale", seed=seed, settings=overrides, validate_dynamodb=False,
                        partition_throughput=os.environ.get("SCALE_PARTITIONS") == "1")
    try:
        nodes = [world.cluster.add_node(f"node-{i:04d}") for i in range(node_count)]
        for i in range(spares):
            world.cluster.add_node(f"spare-{i:02d}")
        job = launch_tagged_job(world, "big-job", nodes, tasks_per_node=GPUS_PER_NODE if per_gpu else 1,
                                gpus_per_task=1 if per_gpu else GPUS_PER_NODE)
        sim = world.sim
        # ---------------------------------------------------------------- registration
        registration = _Registration(world, job)
        t_setup = sim.now
        read_bucket = world.account.buckets["ecs_read"]
        if lift_setup_reads:
            # Set-up only: no Describe/List limit while the job registers (see the docstring);
            # the fault runs at the account's real limits again.
            world.account.buckets["ecs_read"] = AccountRateLimit(burst=1e12, rate=1e12)
            out["setup_reads_unlimited"] = True
        why = sim.run(until=t_setup + SETUP_LIMIT_SECONDS, stop=registration.done,
                      check_every=max(50, size // 4), wall_seconds=wall_cap)
        world.account.buckets["ecs_read"] = read_bucket
        read_bucket.last = sim.now  # full again: registration long over in a real account
        read_bucket.tokens = read_bucket.burst
        out["registration"] = _registration_figures(world, job, registration, t_setup)
        walls = out["wall_phases_s"] = {"registration": round(time.perf_counter() - started, 1)}
        if why == "wall":
            return _incomplete(out, f"wall-clock cap ({wall_cap:.0f} s) reached while registering", started)
        if registration.missing:
            registered = job.world_size - len(registration.missing)
            return _incomplete(out, f"job not protected: {registered} of {job.world_size} ranks registered "
                                    f"after {SETUP_LIMIT_SECONDS / 60:.0f} simulated minutes", started)
        sim.run(until=sim.now + SETTLE_SECONDS,
                wall_seconds=max(1.0, wall_cap - (time.perf_counter() - started)))
        world.reset_measurements()
        # ---------------------------------------------------------------- the fault
        t_fault = sim.now
        world.cluster.fail_gpu(nodes[0], health="reboot_fixable", exit_code=1,
                               nccl_cascade=scenario == "cascade",
                               cascade_delay=lambda: sim.rng.uniform(0.5, cascade_seconds))

        def finished() -> bool:
            fields = _job_fields(world, job.job_id)
            state, attempt = fields.get("job_state"), int(fields.get("attempt") or 1)
            return state in TERMINAL or (attempt >= 2 and state == "RUNNING"
                                         and attempt in job.all_running_at)

        remaining = wall_cap - (time.perf_counter() - started)
        why = sim.run(until=t_fault + RECOVERY_LIMIT_SECONDS, stop=finished, check_every=max(20, size // 8),
                      wall_seconds=max(1.0, remaining))
        outcome_at = sim.now
        walls["recovery"] = round(time.perf_counter() - started - sum(walls.values()), 1)
        if why == "stop":
            remaining = wall_cap - (time.perf_counter() - started)
            sim.run(until=sim.now + MARGIN_SECONDS, wall_seconds=max(1.0, remaining))
        walls["margin"] = round(time.perf_counter() - started - sum(walls.values()), 1)
        fields = _job_fields(world, job.job_id)
        out.update(_recovery_figures(world, job, t_fault, outcome_at, fields))
        if why == "wall":
            return _incomplete(out, f"wall-clock cap ({wall_cap:.0f} s) reached {outcome_at - t_fault:.0f} "
                                    f"simulated s after the fault (job {fields.get('job_state')}, attempt "
                                    f"{fields.get('attempt')})", started)
        if why != "stop":
            return _incomplete(out, f"no outcome {RECOVERY_LIMIT_SECONDS / 3600:.0f} simulated hours after "
                                    f"the fault (job {fields.get('job_state')})", started)
        state = fields.get("job_state")
        if state != "RUNNING":
            reason = str(fields.get("last_error") or "")[:200]
            return _incomplete(out, f"job {state}: {reason}", started)
        out["outcome"] = "recovered"
        out["wall_s"] = round(time.perf_counter() - started, 1)
        return out
    except Exception as error:  # a bench run reports, it does not crash
        out["traceback"] = traceback.format_exc(limit=8)
        return _incomplete(out, f"error: {type(error).__name__}: {error}", started)
    finally:
        world.close()
        _held_to_the_contract(world, out, started)
        gc.collect()


def _held_to_the_contract(world: ScaleWorld, out: dict[str, Any], started: float) -> None:
    """Every request held to what AWS accepts (local_mode/sim/contract/requests.py): a run
    that made one AWS would refuse did not complete, whatever its job did."""
    refused = [str(v) for v in world.requests.violations]
    if refused:
        out["contract_violations"] = refused
        if out.get("outcome") == "recovered":
            _incomplete(out, f"{len(refused)} request(s) AWS would refuse: {refused[0]}", started)


def _incomplete(out: dict[str, Any], why: str, started: float) -> dict[str, Any]:
    out["outcome"] = f"did not complete: {why}"
    out["wall_s"] = round(time.perf_counter() - started, 1)
    return out


def _registration_figures(world: ScaleWorld, job: TaggedJob, registration: _Registration,
                          t_setup: float) -> dict[str, Any]:
    usage = world.dynamo.meter.total
    stats = world.account.stats
    # When the last rank item was written (the stop check runs between events, later).
    times = [float(item["registered_at"]) for r in range(job.world_size) if r not in registration.missing
             for item in [world.dynamo.peek_attributes(JOB_TABLE, {C.JOB_PK: C.rank_item_key(job.job_id, r)},
                                                       ("registered_at",)) or {}] if "registered_at" in item]
    seconds = (max(times) if times and not registration.missing else world.sim.now) - t_setup
    return {"ranks_registered": job.world_size - len(registration.missing), "simulated_s": round(seconds, 1),
            "dynamodb_items_read": usage.items_read, "dynamodb_items_written": usage.items_written,
            "aws_calls": dict(sorted(stats.calls.items())), "ecs_throttled": sum(stats.throttled.values()),
            "calls_failed": sum(stats.failed.values()), "dead_letters": len(world.lambdas.dead_letters),
            "lambda_timeouts": sum(f.stats.timeouts for f in world.lambdas.functions.values())}


def _recovery_figures(world: ScaleWorld, job: TaggedJob, t_fault: float, outcome_at: float,
                      fields: dict[str, Any]) -> dict[str, Any]:
    usage = world.dynamo.meter.total
    n = job.world_size
    stats = world.account.stats
    ecs_calls = {k.split(":", 1)[1]: v for k, v in sorted(stats.calls.items()) if k.startswith("ecs:")}
    control = sum(v for k, v in ecs_calls.items() if k in world.account.ECS_CONTROL)
    read = sum(v for k, v in ecs_calls.items() if k in world.account.ECS_READ)
    control_bucket = world.account.buckets["ecs_control"]
    attempt = int(fields.get("attempt") or 1)
    all_running = job.all_running_at.get(attempt) if attempt >= 2 else None
    cluster = world.cluster
    # The restart's StartTasks at best: up to 10 identical ranks a call (distinct nodes), all
    # after the reboot (the stops, long before, leave the bucket full again).
    restarts = math.ceil(n / MAX_INSTANCES_PER_START) if world.settings.batch_identical_starts else n
    data_plane_floor = 2 * cluster.run_delay_seconds + cluster.dcgm_seconds + cluster.reboot_seconds
    # The last node's check (every node checked): it cannot start before the stack has stopped
    # every task it stops itself (StopTask takes one task a call) and started every check (at
    # best 10 nodes a StartTask), all on the same bucket; then its start, the diag and the
    # restart's own start. Below the path above when only a few nodes are checked.
    # A task the stack stops holds its node's GPUs until it has stopped (ECS's StopTask: the
    # signal, then the task's exit, ``stop_delay_seconds`` here), so the last node's check
    # starts that long after the last StopTask at the earliest.
    stopped = ecs_calls.get("StopTask", 0) - stats.throttled.get("ecs:StopTask", 0)
    checked = sum(cluster.health_checks.values())
    check_calls = stopped + math.ceil(checked / MAX_INSTANCES_PER_START)
    check_path = 2 * cluster.run_delay_seconds + cluster.dcgm_seconds + (cluster.stop_delay_seconds
                                                                         if stopped else 0.0)
    checks_floor = check_path + control_bucket.floor_seconds(check_calls)
    functions = {name: f.stats.as_dict(f.timeout) for name, f in sorted(world.lambdas.functions.items())}
    dead = Counter(d.function for d in world.lambdas.dead_letters)
    gang = world.gang_queue()
    queue = gang.stats() if gang is not None else {}
    if gang is not None:
        # Redriven to the DLQ, or failed maxReceiveCount times already (redriven at the next receive).
        doomed = sum(1 for m in gang.messages.values() if m.receive_count >= (gang.max_receive_count or 0))
        if queue["moved_to_dead_letter"] + doomed:
            dead["gang_worker (SQS DLQ)"] = queue["moved_to_dead_letter"] + doomed
    notes = world.topic.published
    suspects = world.suspects(job.job_id, attempt=1)
    floor = max(data_plane_floor, checks_floor) + control_bucket.floor_seconds(restarts)
    # The same path at the stack's own share of the bucket (``ecs_api_rate_per_second``, 36/s
    # by default: the rest is left to the account's other ECS clients by design).
    share = world.settings.ecs_api
    share_floor = (max(data_plane_floor, check_path
                       + rate_limit.floor_seconds(check_calls, burst=share.burst, rate=share.rate))
                   + rate_limit.floor_seconds(restarts, burst=share.burst, rate=share.rate))
    took = all_running - t_fault if all_running else None
    budget_waits = [b.waited_seconds for b in world.budgets]
    return {
        "job_state": fields.get("job_state"), "attempt": attempt,
        "fault_to_all_running_s": round(took, 1) if took is not None else None,
        "floor_s": round(floor, 1),
        "above_floor_s": round(took - floor, 1) if took is not None else None,
        "share_floor_s": round(share_floor, 1), "share_rate": share.rate,
        "above_share_floor_s": round(took - share_floor, 1) if took is not None else None,
        "floor_detail": {"data_plane_s": data_plane_floor, "restart_start_calls": restarts,
                         "restart_bucket_s": round(control_bucket.floor_seconds(restarts), 1),
                         "checks_s": round(checks_floor, 1), "stops_and_check_start_calls": check_calls},
        "simulated_s": round(outcome_at - t_fault, 1),
        "dynamodb": {
            "items_read": usage.items_read, "items_written": usage.items_written,
            "items_read_per_rank": round(usage.items_read / n, 1),
            "items_written_per_rank": round(usage.items_written / n, 2),
            "read_units": round(usage.read_units), "write_units": round(usage.write_units),
            "largest_item_bytes": usage.largest_item_bytes, "largest_item": usage.largest_item,
            "calls": dict(sorted(usage.calls.items())), "conflicts": usage.conflicts,
            "conflicts_per_rank": round(usage.conflicts / n, 2),
            "conflicts_by_item": dict(usage.conflicts_by_item.most_common(5)),
            "errors": dict(sorted(usage.errors.items())),
            "job_item_bytes": world.dynamo.item_bytes(JOB_TABLE).get(
                f"{JOB_TABLE}:{C.job_item_key(job.job_id)}", 0),
            "instance_items": len(world.dynamo.item_bytes(INSTANCE_TABLE)),
            **_partitions(world.dynamo.partition_throughput),
        },
        "ecs": {"calls": ecs_calls, "control_plane_calls": control, "read_calls": read,
                "control_per_rank": round(control / n, 2),
                "bucket_floor_s": round(control_bucket.floor_seconds(control), 1),
                "throttled": {k.split(":", 1)[1]: v for k, v in sorted(stats.throttled.items())},
                "throttled_total": sum(stats.throttled.values()),
                "failed_after_retries": sum(stats.failed.values()),
                "budget_waited_s_total": round(sum(budget_waits), 1),
                "budget_waited_s_max_container": round(max(budget_waits, default=0.0), 1)},
        "gang_queue": queue,
        "lambda": {"functions": functions, "max_concurrency": world.lambdas.max_running,
                   "waited_for_concurrency": world.lambdas.throttled},
        "dead_letters": dict(sorted(dead.items())), "dead_letters_total": sum(dead.values()),
        "suspects": len(suspects),
        "suspect_verdicts": dict(Counter(suspects.values())),
        "health_checks": sum(cluster.health_checks.values()),
        "health_checks_max_per_node": max(cluster.health_checks.values(), default=0),
        "reboots": sum(cluster.reboots.values()),
        "notifications": len(notes),
        "largest_notification_bytes": max((x.size for x in notes), default=0),
        "notifications_refused": len(world.topic.refused),
        "largest_refused_bytes": max((x.size for x in world.topic.refused), default=0),
        "other_calls": {k: v for k, v in sorted(stats.calls.items()) if not k.startswith("ecs:")},
        "metrics": dict(sorted(world.metrics.values.items())),
    }


def _print(result: dict[str, Any]) -> None:
    head = (f"{result['layout']:>8} {result['tasks']:>5} tasks / {result['nodes']:>4} nodes, "
            f"{result['scenario']}")
    phases = ", ".join(f"{k} {v}" for k, v in (result.get("wall_phases_s") or {}).items())
    print(f"\n{head}: {result['outcome']}  [wall {result['wall_s']} s{': ' + phases if phases else ''}]")
    reg = result.get("registration")
    if reg:
        print(f"  registration (set-up): {reg['ranks_registered']} ranks in {reg['simulated_s']} s; AWS "
              f"{sum(reg['aws_calls'].values())} calls (DynamoDB aside), {reg['ecs_throttled']} throttled, "
              f"{reg['calls_failed']} failed after retries; DynamoDB {reg['dynamodb_items_read']} read / "
              f"{reg['dynamodb_items_written']} written; dead letters {reg['dead_letters']}")
    if "dynamodb" not in result:
        return
    d, e, lam = result["dynamodb"], result["ecs"], result["lambda"]
    t = result["fault_to_all_running_s"]
    floor = result["floor_detail"]
    checks = (f"the last check: {floor['stops_and_check_start_calls']:,} StopTasks and check starts at 40/s "
              f"+ the last stop + DCGM + starts {floor['checks_s']} s"
              if floor["checks_s"] > floor["data_plane_s"]
              else f"DCGM + reboot + starts {floor['data_plane_s']:.0f} s")
    print(f"  fault -> every rank RUNNING: {t if t is not None else '-'} s (floor {result['floor_s']} s: "
          f"{checks}, the restart's "
          f"{floor['restart_start_calls']} StartTasks at 40/s {floor['restart_bucket_s']} s; "
          f"above it {result['above_floor_s']} s; above the same path at the stack's "
          f"{result['share_rate']:g}/s {result['above_share_floor_s']} s); "
          f"job {result['job_state']} attempt {result['attempt']}")
    print(f"  DynamoDB: {d['items_read']:,} items read ({d['items_read_per_rank']}/rank), "
          f"{d['items_written']:,} written ({d['items_written_per_rank']}/rank); {d['read_units']:,} RRU, "
          f"{d['write_units']:,} WRU; largest item {d['largest_item_bytes']:,} B ({d['largest_item']}); "
          f"conflicts {d['conflicts']} ({d['conflicts_per_rank']}/rank); errors {d['errors'] or '-'}")
    if "busiest_partition" in d:
        print(f"  DynamoDB partitions (SCALE_PARTITIONS=1): busiest {d['busiest_partition']} "
              f"{d['busiest_partition_wcu_per_second']} WCU in a second; throttled {d['throttled'] or 0}")
    if d["conflicts_by_item"]:
        hot = ", ".join(f"{k} {v}" for k, v in d["conflicts_by_item"].items())
        print(f"  conflicts by item (the 5 most): {hot}")
    control = ", ".join(f"{k} {v}" for k, v in e["calls"].items() if k in CONTROL_PLANE)
    print(f"  ECS: {e['control_plane_calls']:,} control-plane calls ({e['control_per_rank']}/rank: "
          f"{control}), bucket floor {e['bucket_floor_s']} s; {e['read_calls']:,} describe/list; throttled "
          f"{e['throttled_total']:,} {e['throttled'] or ''}; failed after retries "
          f"{e['failed_after_retries']}; waited for the stack's budget {e['budget_waited_s_total']} s "
          f"(one container at most {e['budget_waited_s_max_container']} s)")
    q = result.get("gang_queue") or {}
    if q:
        print(f"  gang queue: {q['sent']} batches sent, {q['batches']} received (max "
              f"{q['max_concurrency']} at once), {q['failed_items']} failed; left {q['in_queue']} "
              f"(received twice or more "
              f"{q['in_queue_received_twice_or_more']}); DLQ {q['dead_letter_queue']}")
    longest = ", ".join(f"{name} {f['longest_s']}/{f['timeout_s']:.0f} s"
                        + (f" ({f['timeouts']} timed out)" if f["timeouts"] else "")
                        for name, f in lam["functions"].items())
    print(f"  Lambda longest invocation / timeout: {longest}; max concurrency {lam['max_concurrency']}")
    runs = ", ".join(f"{name} {f['invocations']:,} ({f['invocations'] / result['tasks']:.2f}/rank)"
                     for name, f in lam["functions"].items())
    print(f"  Lambda invocations: {runs}")
    refused = result["notifications_refused"]
    print(f"  dead letters {result['dead_letters_total']} {result['dead_letters'] or ''}; suspects "
          f"{result['suspects']}, health checks {result['health_checks']} "
          f"(max {result['health_checks_max_per_node']}/node), reboots {result['reboots']}; notifications "
          f"{result['notifications']} (largest {result['largest_notification_bytes']:,} B; refused {refused}"
          + (f", {result['largest_refused_bytes']:,} B" if refused else "") + "; SNS limit 262,144 B)")


# ------------------------------------------------------------------ registration (issue 28)
REGISTRATION_SIZES = (1024, 8192)
REGISTRATION_KINDS = ("convention", "tags")
REGISTRATION_LIMIT_SECONDS = 1800.0  # simulated


def run_registration(size: int, kind: str, *, seed: int = 20261120,
                     wall_cap: float = 600.0) -> dict[str, Any]:
    """``size`` tasks started in the same second (one per node up to 1,024, else one per GPU
    of 8-GPU nodes), registered by the convention or by their tags alone (the deployment's
    default ``registration`` = both): until every rank has its item."""
    started = time.perf_counter()
    per_gpu = size > 1024
    node_count = size // GPUS_PER_NODE if per_gpu else size
    out: dict[str, Any] = {"tasks": size, "nodes": node_count, "by": kind, "seed": seed}
    world = build_world(backend="scale", seed=seed, validate_dynamodb=False)
    try:
        nodes = [world.cluster.add_node(f"node-{i:04d}") for i in range(node_count)]
        world.sim.run(until=world.sim.now + 60.0)  # the nodes' own events, before the job
        world.reset_measurements()
        t0 = world.sim.now
        job = launch_tagged_job(world, "big-job", nodes, tasks_per_node=GPUS_PER_NODE if per_gpu else 1,
                                gpus_per_task=1 if per_gpu else GPUS_PER_NODE, registration=kind)
        registration = _Registration(world, job)
        why = world.sim.run(until=t0 + REGISTRATION_LIMIT_SECONDS, stop=registration.done,
                            check_every=max(50, size // 4), wall_seconds=wall_cap)
        if why == "stop":  # late duplicates, retries and dead letters of the registration
            world.sim.run(until=world.sim.now + MARGIN_SECONDS,
                          wall_seconds=max(1.0, wall_cap - (time.perf_counter() - started)))
        figures = _registration_figures(world, job, registration, t0)
        stats = world.account.stats
        handler = world.lambdas.functions["ecs_task_handler"].stats
        out.update(figures)
        out.update(
            seconds_from_running=round(figures["simulated_s"] - world.cluster.run_delay_seconds, 1),
            describe_tasks=stats.calls.get("ecs:DescribeTasks", 0),
            describe_tasks_throttled=stats.throttled.get("ecs:DescribeTasks", 0),
            describe_container_instances=stats.calls.get("ecs:DescribeContainerInstances", 0),
            handler_invocations=handler.invocations,
            outcome="registered" if not registration.missing else
            ("wall-clock cap reached" if why == "wall" else
             f"{size - len(registration.missing)} of {size} registered after "
             f"{REGISTRATION_LIMIT_SECONDS / 60:.0f} simulated minutes"))
        out["wall_s"] = round(time.perf_counter() - started, 1)
        return out
    except Exception as error:  # a bench run reports, it does not crash
        out["traceback"] = traceback.format_exc(limit=8)
        return _incomplete(out, f"error: {type(error).__name__}: {error}", started)
    finally:
        world.close()
        _held_to_the_contract(world, out, started)
        gc.collect()


MIXED_TASKS = 1000


def run_mixed(registration: str, *, seed: int = 20261120, wall_cap: float = 600.0) -> dict[str, Any]:
    """1,000 tasks of another workload (no tags, no convention: a web service's churn) start
    and stop beside the stack, 10 a second, each running 30-120 s: what they cost it."""
    started = time.perf_counter()
    out: dict[str, Any] = {"registration": registration, "tasks": MIXED_TASKS, "seed": seed}
    world = build_world(backend="scale", seed=seed, settings={"registration": registration},
                        validate_dynamodb=False)
    try:
        nodes = [world.cluster.add_node(f"web-{i:03d}") for i in range(50)]
        definition = world.cluster.register_task_definition("web", gpus=0, container="web")
        world.sim.run(until=world.sim.now + 60.0)
        world.reset_measurements()
        sim = world.sim
        t0 = sim.now
        for i in range(MIXED_TASKS):
            def start(i: int = i) -> None:
                task = world.cluster.launch(definition, nodes[i % len(nodes)], started_by="ecs-svc/web",
                                            group="service:web")
                world.cluster.exit_task(task, 0, after=sim.rng.uniform(30.0, 120.0), why="scale-in")
            sim.after(i / 10.0, start, "web task")
        sim.run(until=t0 + MIXED_TASKS / 10.0 + 120.0 + MARGIN_SECONDS, wall_seconds=wall_cap)
        stats = world.account.stats
        handler = world.lambdas.functions["ecs_task_handler"].stats
        out.update(handler_invocations=handler.invocations,
                   describe_tasks=stats.calls.get("ecs:DescribeTasks", 0),
                   describe_tasks_throttled=stats.throttled.get("ecs:DescribeTasks", 0),
                   stopped=sum(1 for t in world.cluster.tasks.values() if t.done),
                   dead_letters=len(world.lambdas.dead_letters),
                   dynamodb_items_read=world.dynamo.meter.total.items_read,
                   dynamodb_items_written=world.dynamo.meter.total.items_written,
                   outcome="done", wall_s=round(time.perf_counter() - started, 1))
        return out
    except Exception as error:  # a bench run reports, it does not crash
        out["traceback"] = traceback.format_exc(limit=8)
        return _incomplete(out, f"error: {type(error).__name__}: {error}", started)
    finally:
        world.close()
        _held_to_the_contract(world, out, started)
        gc.collect()


def _print_registration(r: dict[str, Any]) -> None:
    print(f"\nregistration {r['tasks']:>5} tasks RUNNING in the same second, by {r['by']}: {r['outcome']} "
          f"[wall {r['wall_s']} s]")
    if "ranks_registered" in r:
        print(f"  {r['ranks_registered']} ranks registered {r['seconds_from_running']} s after their RUNNING "
              f"event; DescribeTasks {r['describe_tasks']:,} calls ({r['describe_tasks_throttled']:,} "
              f"throttled), DescribeContainerInstances {r['describe_container_instances']:,}; "
              f"ecs_task_handler {r['handler_invocations']:,} invocations; dead letters {r['dead_letters']}; "
              f"DynamoDB {r['dynamodb_items_read']:,} read / {r['dynamodb_items_written']:,} written")


def _print_mixed(r: dict[str, Any]) -> None:
    print(f"\nmixed cluster, registration={r['registration']}: {r['tasks']} unprotected tasks start and "
          f"stop: {r['outcome']} [wall {r['wall_s']} s]")
    if "handler_invocations" in r:
        n = r["tasks"]
        print(f"  ecs_task_handler {r['handler_invocations']:,} invocations "
              f"({r['handler_invocations'] / n:.2f}/task), DescribeTasks {r['describe_tasks']:,} "
              f"({r['describe_tasks'] / n:.2f}/task, {r['describe_tasks_throttled']} throttled); "
              f"DynamoDB {r['dynamodb_items_read']:,} read / {r['dynamodb_items_written']:,} written; "
              f"dead letters {r['dead_letters']}; {r['stopped']} stopped")


def run_registration_lines(seed: int, wall_cap: float) -> dict[str, Any]:
    """``SCALE_REGISTRATION``: sizes (default 1024,8192; "0": none), ``SCALE_REGISTRATION_BY``
    (convention,tags), ``SCALE_MIXED`` (convention,both; "0": none)."""
    results: dict[str, Any] = {}
    sizes = _env_list("SCALE_REGISTRATION", tuple(str(n) for n in REGISTRATION_SIZES))
    for size in (int(n) for n in sizes if n != "0"):
        for kind in _env_list("SCALE_REGISTRATION_BY", REGISTRATION_KINDS):
            if kind not in REGISTRATION_KINDS:
                raise ValueError(f"SCALE_REGISTRATION_BY: unknown {kind!r} ({', '.join(REGISTRATION_KINDS)})")
            result = run_registration(size, kind, seed=seed, wall_cap=wall_cap)
            _print_registration(result)
            results[f"registration/{size}/{kind}"] = result
    for mode in _env_list("SCALE_MIXED", ("convention", "both")):
        if mode == "0":
            continue
        if mode not in C.REGISTRATION_MODES:
            raise ValueError(f"SCALE_MIXED: unknown {mode!r} ({', '.join(C.REGISTRATION_MODES)})")
        result = run_mixed(mode, seed=seed, wall_cap=wall_cap)
        _print_mixed(result)
        results[f"mixed/{mode}"] = result
    return results


def run() -> dict[str, Any]:
    logging.disable(logging.CRITICAL)  # the code under test logs every step of thousands of ranks
    seed = int(os.environ.get("SCALE_SEED", "20261120"))
    spares = int(os.environ.get("SCALE_SPARES", "2"))
    wall_cap = float(os.environ.get("SCALE_WALL_SECONDS", "600"))
    # Recovery Settings fields to override, as JSON (e.g. '{"max_health_checks_per_job": 1024}').
    settings = json.loads(os.environ.get("SCALE_SETTINGS") or "{}")
    lift = os.environ.get("SCALE_SETUP_READS_UNLIMITED", "") == "1"
    results: dict[str, Any] = {}
    try:
        results.update(run_registration_lines(seed, wall_cap))
        for layout, size, scenario in plan():
            result = run_scenario(layout, size, scenario, seed=seed, spares=spares, wall_cap=wall_cap,
                                  settings=settings, lift_setup_reads=lift)
            _print(result)
            results[f"{layout}/{size}/{scenario}"] = result
    finally:
        logging.disable(logging.NOTSET)
    return results
