"""Validation after repair (issue 43): what it adds to a restart, and what it catches.

1. **What validation adds to a restart** (simulated time, the deployed handlers on the
   emulator and the simulated ECS data plane): fault -> every rank of a 2-node job running
   again, per repair path, with validation off and on (the deployment's default: DCGM level 1,
   about 15 s here, + 30 s of GPU load). A validation runs on each repaired node in parallel,
   so what it adds does not grow with the job's size: one StartTask per repaired node (the
   ECS budget's), the slowest node's validation on the restart's path.
2. **Caught by validation, never by the job**: a 6-node cluster, three 2-node jobs, and three
   faults on nodes whose first repair does not hold (each passes an idle check after its
   reboot, then fails again under load: ``SimulatedEcs.repair_does_not_hold``, a training
   task 3 minutes in). Counted with validation off and on: the restarts of a job onto such a
   node (a training task placed while its fault was latent), the job faults that followed, the
   infrastructure recoveries they charged (a repeat of one cause on one node is not charged
   twice), the jobs' minutes lost beyond their uninterrupted run (each restart starts the
   simulated run over), the node reboots, the validations that failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery.domain.validation import ValidationPolicy

MIN = 60
DCGM_SECONDS = 120
REBOOT_SECONDS = 180
RESET_SECONDS = 30
ON = ValidationPolicy(enabled=True)  # the deployment's default
PATHS = (("diag_reboot", "DCGM diag + reboot"), ("diag_reset", "DCGM diag + GPU reset"),
         ("fast_path_reboot", "fast-path reboot (XID 79)"))
CATCH_NODES = 6
CATCH_JOBS = (("j1", ["n1", "n2"]), ("j2", ["n3", "n4"]), ("j3", ["n5", "n6"]))
CATCH_FAULTS = (("n2", 10 * MIN), ("n3", 30 * MIN), ("n6", 50 * MIN))  # node, at (after the start)
CATCH_HOURS = 4.0
CATCH_TRAIN_MINUTES = 90


@contextmanager
def _world(validation: ValidationPolicy | None, *, train_seconds: float) -> Iterator[Any]:
    from local_mode.remediation_scenarios import world

    env = {C.ENV_POST_REPAIR_VALIDATION: validation.to_json()} if validation is not None else {}
    with world(duplicate_delivery=False, dcgm_seconds=DCGM_SECONDS, reboot_seconds=REBOOT_SECONDS,
               reset_seconds=RESET_SECONDS, extra_env=env) as w:
        w.ecs.plan_family("train", run_seconds=train_seconds, exit_code=0)
        yield w


def _restart_seconds(path: str, validation: ValidationPolicy | None) -> float:
    """Fault -> every rank of attempt 2 running, simulated seconds."""
    with _world(validation, train_seconds=60 * MIN) as w:
        for node in ("node-a", "node-b"):
            w.ecs.add_node(node)
        w.ecs.start_job("mttr", w.training_task_definition, ["node-a", "node-b"])
        w.ecs.run_for(MIN)
        fault_at = w.ecs.now() + MIN
        if path == "diag_reboot":
            w.ecs.inject_gpu_fault("node-b", at=fault_at, health="reboot_fixable", nccl_cascade=True)
        elif path == "diag_reset":
            w.ecs.inject_gpu_fault("node-b", at=fault_at, health="reset_fixable", nccl_cascade=True)
        else:
            w.ecs.inject_xid("node-b", 79, at=fault_at, nccl_cascade=True, crash_delay_seconds=0,
                             report_delay_seconds=0)
        w.ecs.run_until(fault_at)

        def back() -> bool:
            return sum(1 for t in w.ecs.tasks.values() if not t.health_check
                       and t.tags.get(C.TAG_ATTEMPT) == "2" and t.last_status == "RUNNING") == 2

        if not w.ecs.run_until_true(back, max_seconds=30 * MIN):
            raise RuntimeError(f"{path}: the job did not run again within 30 minutes")
        started = max(t.started_at or 0.0 for t in w.ecs.tasks.values()
                      if t.tags.get(C.TAG_ATTEMPT) == "2" and not t.health_check)
        return started - fault_at


def _catch(validation: ValidationPolicy | None) -> dict[str, Any]:
    """The 6-node run: what a repair that does not hold costs the jobs, and who catches it."""
    with _world(validation, train_seconds=CATCH_TRAIN_MINUTES * MIN) as w:
        for i in range(1, CATCH_NODES + 1):
            w.ecs.add_node(f"n{i}")
        for job, nodes in CATCH_JOBS:
            w.ecs.start_job(job, w.training_task_definition, nodes)
        start = w.ecs.now()
        for node, after in CATCH_FAULTS:
            w.ecs.repair_does_not_hold(node, 1)
            w.ecs.inject_gpu_fault(node, at=start + after, health="reboot_fixable", nccl_cascade=True)
        w.ecs.run_for(CATCH_HOURS * 3600)
        faulty = {node for node, _ in CATCH_FAULTS}
        jobs = {job: w.repo.jobs.get_job(job) for job, _ in CATCH_JOBS}
        validations = [t for t in w.ecs.tasks.values() if t.validation and t.done]
        refaults = [e for e in w.ecs.timeline if e.kind == "fault" and "repair did not hold" in e.text]
        complete = [j for j in jobs.values() if j is not None and j.state is C.JobState.COMPLETE]
        # Each job's time to completion beyond its uninterrupted run (restarts start over here).
        ended = {job: max((t.stopped_at or 0.0) for t in w.ecs.tasks.values()
                          if t.tags.get(C.TAG_JOB_ID) == job) for job, _ in CATCH_JOBS}
        lost = sum(ended[j.job_id] - start - CATCH_TRAIN_MINUTES * MIN for j in complete)
        return {
            "restarts_onto_unheld_repairs": sum(1 for p in w.ecs.placements if p.training and p.latent),
            "job_faults_from_unheld_repairs": len(refaults),
            "recoveries_charged": sum(j.recoveries_used for j in jobs.values() if j is not None),
            "jobs_complete": len(complete),
            "job_minutes_lost": round(lost / MIN),
            "node_reboots": sum(w.ecs.node(n).reboots for n in faulty),
            "validations_failed": sum(1 for t in validations if t.exit_code not in (0, None)),
            "validations_passed": sum(1 for t in validations if t.exit_code == 0),
        }


def run(print_report: bool = True) -> dict[str, Any]:
    from bench.recovery_bench import quiet_logs

    quiet_logs()
    added: dict[str, Any] = {}
    for path, _ in PATHS:
        off, on = _restart_seconds(path, None), _restart_seconds(path, ON)
        added[path] = {"off_seconds": round(off, 1), "on_seconds": round(on, 1),
                       "added_seconds": round(on - off, 1)}
    caught = {"off": _catch(None), "on": _catch(ON)}
    results = {"validation": {"dcgm_level": ON.dcgm_level, "load_seconds": ON.load_seconds},
               "added_to_a_restart": added, "repairs_that_do_not_hold": caught}
    if print_report:
        print(f"\nWhat validation adds to a restart (fault -> every rank running again, 2-node job, "
              f"simulated; validation: {ON.describe()}, a level-1 diag ~15 s here)")
        print(f"  {'path':<32} {'off':>7} {'on':>7} {'added':>7}")
        for path, title in PATHS:
            r = added[path]
            print(f"  {title:<32} {r['off_seconds']:>6.0f}s {r['on_seconds']:>6.0f}s "
                  f"{r['added_seconds']:>6.0f}s")
        print("  per repaired node, in parallel: the same at 8, 128 or 1,024 ranks (one StartTask per "
              "repaired node on the ECS budget)")
        print(f"\nRepairs that do not hold: {CATCH_NODES} nodes, {len(CATCH_JOBS)} 2-node jobs, "
              f"{len(CATCH_FAULTS)} faults on nodes whose first repair does not hold, "
              f"{CATCH_HOURS:g} h simulated")
        keys = ("restarts_onto_unheld_repairs", "job_faults_from_unheld_repairs", "recoveries_charged",
                "jobs_complete", "job_minutes_lost", "node_reboots", "validations_failed",
                "validations_passed")
        print(f"  {'':<34} {'off':>5} {'on':>5}")
        for key in keys:
            print(f"  {key.replace('_', ' '):<34} {caught['off'][key]:>5} {caught['on'][key]:>5}")
    return results


if __name__ == "__main__":
    run()
