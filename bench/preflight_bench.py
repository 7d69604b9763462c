"""Gang preflight (issue 43): rounds to pin a fault, and what the preflight adds to a restart.

* **Rounds to pin** (``domain.preflight.pinning``, the search itself against a model fabric
  where a group fails when it holds the fault): for N = 2, 8, 16, 128 nodes, every node's
  own network path and every link between two nodes (N = 128: all 8,128 links), the rounds
  (the preflight itself is round 1), whether exactly the responsible node(s) were pinned,
  and healthy nodes pinned (cordoned). Two faults at once (random, seeded) for the share
  that pins a healthy node (the bound holds for one fault).
* **What it adds to a restart** (simulated; moto with the in-memory DynamoDB, the real
  control-API handler and authorizer, the shipped client's steps, the simulated fabric's
  timing: ``local_mode/sim/fabric.py``): a queue job's ranks start as a gang restart starts
  them (10 ranks a StartTask at the stack's ECS budget, RUNNING 5 s later) and run the
  wrapper; the figure is the last rank told to train minus the last rank RUNNING (what
  training waits on top of today's restart), at 8, 128 and 1,024 ranks (one per 8-GPU
  node). Today's reset-class restart for comparison is the remediation section's
  "DCGM diag + GPU reset" (2 nodes) and the large-jobs section's.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import time
from functools import partial
from statistics import mean
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain.preflight.pinning import Fault, simulate

ROUND_SIZES = (2, 8, 16, 128)
RESTART_SIZES = (8, 128, 1024)
GPUS = 8
GOAL_SECONDS = 60.0


def rounds_to_pin(n: int, *, seed: int = 43) -> dict[str, Any]:
    m = math.ceil(math.log2(n))
    nodes = [simulate(n, [Fault((x,))]) for x in range(n)]
    links = {(a, b): simulate(n, [Fault((a, b))]) for a, b in itertools.combinations(range(n), 2)}
    rng = random.Random(seed)
    doubles, healthy_doubles = 0, 0
    for _ in range(200 if n >= 4 else 0):
        faults = []
        for _k in range(2):
            if rng.random() < 0.5:
                faults.append(Fault((rng.randrange(n),)))
            else:
                faults.append(Fault(tuple(sorted(rng.sample(range(n), 2)))))
        sim = simulate(n, faults)
        bad = {x for f in faults for x in f.nodes}
        doubles += 1
        healthy_doubles += bool(set(sim.pinned) - bad)
    node_healthy = sum(len(set(s.pinned) - {x}) for x, s in enumerate(nodes))
    link_healthy = sum(len(set(s.pinned) - set(ab)) for ab, s in links.items())
    return {
        "nodes": n, "bound_log2n_plus_1": m + 1, "bound_2log2n": 2 * m,
        "node_path": {"faults": n, "worst_rounds": max(s.rounds for s in nodes),
                      "mean_rounds": round(mean(s.rounds for s in nodes), 2),
                      "exactly_pinned": sum(s.pinned == [x] for x, s in enumerate(nodes)),
                      "healthy_cordoned": node_healthy},
        "link": {"faults": len(links), "worst_rounds": max(s.rounds for s in links.values()),
                 "mean_rounds": round(mean(s.rounds for s in links.values()), 2),
                 "within_log2n_plus_1": sum(s.rounds <= m + 1 for s in links.values()),
                 "exactly_pinned": sum(s.pinned == list(ab) for ab, s in links.items()),
                 "healthy_cordoned": link_healthy},
        "two_faults": {"runs": doubles, "runs_pinning_a_healthy_node": healthy_doubles},
    }


def restart_added(ranks: int) -> dict[str, Any]:
    """A restarted queue job of ``ranks`` nodes runs its preflight on a healthy fabric."""
    from gpu_recovery.domain.control_token import make_token, new_secret
    from gpu_recovery.domain.preflight.settings import SWEEP_MAX_BYTES, SWEEP_MIN_BYTES
    from gpu_recovery.domain.rate_limit import DEFAULT_RATE
    from gpu_recovery.repository.jobs_api import JobQueueRepository
    from local_mode.preflight_programs import PreflightPrograms
    from local_mode.scripts import load_client_library
    from local_mode.server import InProcessOpener, LocalApi
    from local_mode.sim.fabric import test_seconds
    from local_mode.world import build_world

    env = {C.ENV_CONTROL_API_URL: "https://control.invalid/prod",
           C.ENV_PREFLIGHT_SETTINGS: json.dumps({"min_nodes": 8}), "POWERTOOLS_LOG_LEVEL": "CRITICAL"}
    wall = time.perf_counter()
    with build_world(dynamodb="memory", extra_env=env, sweep_every_seconds=None) as world:
        sim = world.ecs
        names = [f"node-{i:04d}" for i in range(ranks)]
        for name in names:
            sim.add_node(name, gpus=GPUS)
        td = sim.register_training_task_definition("train", gpus=GPUS)
        job_id, secret, now = "restarted-job", new_secret(), sim.now()
        JobQueueRepository(world.repo).create_job({
            C.JOB_PK: C.job_item_key(job_id), "item_type": "JOB", "job_id": job_id, "job_state": "RUNNING",
            "source": "queue", "world_size": ranks, "attempt": 2, "restarted_attempt": 2, "preflight": "auto",
            "gpus_per_node": GPUS, "control_secret": secret, "launch": {"instance_type": "p5.48xlarge"},
            "created_at": now, "updated_at": now, "history": []})
        programs = PreflightPrograms(sim, load_client_library(), opener=InProcessOpener(LocalApi()))
        running: dict[int, float] = {}
        trained: dict[int, float] = {}
        def told_to_train(arn: str) -> None:
            trained.setdefault(int(sim.tasks[arn].tags[C.TAG_RANK]), sim.now())

        programs.on_train = told_to_train

        def start(rank: int) -> None:
            token = make_token(job_id, rank, secret)
            environment = {"RANK": str(rank), "ATTEMPT": "2", "MASTER_ADDR": "10.0.0.1",
                           "MASTER_PORT": "29500", C.CONTROL_URL_ENV: "https://control.invalid/prod",
                           C.CONTROL_TOKEN_ENV: token}
            overrides = {"containerOverrides": [{"name": "train", "command": [
                "python", "gpu_recovery_client.py", "preflight", "--", "python", "train.py"],
                "environment": [{"name": k, "value": v} for k, v in environment.items()]}]}
            (arn,) = sim.start_job(job_id, td, [names[rank]], attempt=2, overrides=overrides,
                                   extra_tags={C.TAG_RANK: str(rank), C.TAG_WORLD_SIZE: str(ranks)})
            sim.plan_task(arn, None)

        def watch() -> None:  # each rank's wrapper takes over once its task runs
            for task in sim.running_tasks():
                rank = int(task.tags.get(C.TAG_RANK, "-1"))
                if task.last_status == "RUNNING" and rank >= 0 and rank not in running:
                    running[rank] = sim.now()
                    programs.attach(task, task.environment())
            if len(running) < ranks:
                sim.schedule(sim.now() + 0.5, watch, "bench watch")

        # The restart's starts: 10 identical ranks a StartTask, paced by the stack's ECS budget.
        t0 = sim.now()
        for call, first in enumerate(range(0, ranks, 10)):
            at = t0 + call / DEFAULT_RATE
            for rank in range(first, min(ranks, first + 10)):
                sim.schedule(at, partial(start, rank), "restart start")
        sim.schedule(t0, watch, "bench watch")
        sim.run_until_true(lambda: len(trained) == ranks, max_seconds=1800)
        item = world.repo.preflight.get(job_id, 2) or {}
        last_running = max(running.values()) - t0
        last_train = max(trained.values()) - t0 if len(trained) == ranks else float("nan")
        model = test_seconds(1, GPUS, SWEEP_MIN_BYTES, SWEEP_MAX_BYTES) + \
            test_seconds(ranks, GPUS, SWEEP_MIN_BYTES, SWEEP_MAX_BYTES)
        return {"ranks": ranks, "gpus": ranks * GPUS, "status": item.get("status"),
                "last_rank_running_s": round(last_running, 1), "last_rank_trains_s": round(last_train, 1),
                "added_s": round(last_train - last_running, 1),
                "tests_alone_s": round(model, 1),  # loopback + gang, back to back, no waiting
                "within_goal": last_train - last_running <= GOAL_SECONDS,
                "gang_busbw_gbps": (item.get("results") or {}).get("gang", {}).get("busbw"),
                "wall_s": round(time.perf_counter() - wall, 1)}


def run() -> dict[str, Any]:
    from bench.recovery_bench import quiet_logs

    quiet_logs()
    rounds = [rounds_to_pin(n) for n in ROUND_SIZES]
    print("\nRounds to pin one fault (round 1 = the preflight itself; model fabric: a group fails when it "
          "holds the fault)")
    print(f"  {'N':>4} {'m+1':>4} {'2m':>4} | {'node path: worst':>17} {'mean':>5} {'exact':>7} "
          f"{'healthy':>7} | {'link: worst':>11} {'mean':>5} {'<= m+1':>11} {'exact':>11} {'healthy':>7} | "
          f"{'2 faults: healthy':>17}")
    for r in rounds:
        node, link, two = r["node_path"], r["link"], r["two_faults"]
        print(f"  {r['nodes']:>4} {r['bound_log2n_plus_1']:>4} {r['bound_2log2n']:>4} | "
              f"{node['worst_rounds']:>17} {node['mean_rounds']:>5} "
              f"{node['exactly_pinned']:>3}/{node['faults']:<3} "
              f"{node['healthy_cordoned']:>7} | {link['worst_rounds']:>11} {link['mean_rounds']:>5} "
              f"{link['within_log2n_plus_1']:>5}/{link['faults']:<5} "
              f"{link['exactly_pinned']:>5}/{link['faults']:<5} {link['healthy_cordoned']:>7} | "
              f"{two['runs_pinning_a_healthy_node']:>9}/{two['runs']}")
    restarts = [restart_added(n) for n in RESTART_SIZES]
    print(f"\nWhat the preflight adds to a restart (simulated; goal <= {GOAL_SECONDS:.0f} s above today's "
          "restart)")
    print(f"  {'ranks':>6} {'GPUs':>6} {'last RUNNING':>13} {'last trains':>12} {'added':>7} "
          f"{'tests alone':>12} {'gang busbw':>11} {'status':>8} {'wall':>6}")
    for r in restarts:
        print(f"  {r['ranks']:>6} {r['gpus']:>6} {r['last_rank_running_s']:>12.1f}s "
              f"{r['last_rank_trains_s']:>11.1f}s {r['added_s']:>6.1f}s {r['tests_alone_s']:>11.1f}s "
              f"{r['gang_busbw_gbps'] or 0:>10.1f} {r['status']!s:>8} {r['wall_s']:>5.0f}s")
    return {"rounds_to_pin": rounds, "restart_added": restarts}
