"""What an operator does when an alarm fires, as the runbook says (docs/operations.md): for
the simulations that run long enough to need it (the crash campaigns with calls failing at
random, the soak)."""

from __future__ import annotations

from collections.abc import Mapping

from gpu_recovery.constants import JobState
from gpu_recovery.domain.models import Job

from .world import World


def redrive_lost_stops(world: World, jobs: Mapping[str, Job | None]) -> list[str]:
    """With calls failing at random: the STOPPED events of a RUNNING job's current ranks whose
    every delivery met an injected failure (a first delivery may have written the rank's end but
    not counted it), redriven as the DLQ runbook says (its alarm fired; the sweep does not replay
    them for a job still RUNNING, docs/recovery-loop.md "Known limits"), their calls the
    operator's (neither counted nor broken). What the redrive did: "task at"."""
    current = {r.task_arn for job in jobs.values() if job is not None and job.state is JobState.RUNNING
               for r in world.repo.jobs.get_ranks(job) if r.attempt == job.attempt}
    done = []
    for letter in list(world.bus.dead_letters):
        event = letter.event if isinstance(letter.event, dict) else {}
        detail = event.get("detail") or {}
        if (event.get("detail-type") != "ECS Task State Change" or detail.get("lastStatus") != "STOPPED"
                or detail.get("taskArn") not in current):
            continue
        tries = [d for d in world.bus.deliveries if d.event_id == event.get("id") and d.rule == letter.rule]
        if not tries or any(d.ok or "(injected" not in str(d.error) for d in tries):
            continue
        with world.aws.call_faults.paused():
            delivery = world.bus.redrive(letter)
        outcome = "ok" if delivery.ok else delivery.error
        done.append(f"{detail['taskArn']} at {world.ecs.now():.0f}: {outcome}")
    return done
