"""A simulated GPU cluster wired to the real recovery handlers (moto + SimulatedEcs)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gpu_recovery import constants as C
from gpu_recovery import runtime
from gpu_recovery.constants import JobState


@dataclass
class Cluster:
    local: Any
    bus: Any
    sim: Any
    train_td: str

    @property
    def repo(self) -> Any:
        return runtime.recovery_service().repo

    def job(self, job_id: str) -> Any:
        return self.repo.jobs.get_job(job_id)

    def state(self, job_id: str) -> JobState:
        return self.job(job_id).state

    def instance(self, node: str) -> Any:
        return self.repo.instances.get_instance(self.sim.node(node).container_instance_id)

    def notifications(self, kind: str | None = None) -> list[dict[str, Any]]:
        notes = self.local.notifications()
        if kind is None:
            return notes
        return [n for n in notes if n["attributes"].get(C.NOTIFICATION_KIND_ATTRIBUTE) == kind]

    def counter(self, name: str) -> int:
        return int(self.sim.summary().get(name, 0))


def make_cluster(**options: Any) -> Iterator[Cluster]:
    from local_mode.world import build_world

    warnings.filterwarnings("ignore", category=UserWarning)
    logging.getLogger().setLevel(logging.WARNING)
    local_options = {k: options.pop(k) for k in list(options)
                     if k in ("max_recovery_attempts", "reboot_timeout_minutes",
                              "health_check_timeout_minutes", "suspect_exit_codes", "extra_env")}
    duplicate = options.pop("duplicate_delivery", True)
    with build_world(duplicate_delivery=duplicate, sim_options=options, **local_options) as world:
        td = world.ecs.register_training_task_definition("train", gpus=8)
        world.ecs.plan_family("train", run_seconds=3600, exit_code=0)
        yield Cluster(world.aws, world.bus, world.ecs, td)


@contextmanager
def cluster_with(**options: Any) -> Iterator[Cluster]:
    """A cluster with non-default options (simulator timings, settings, delivery)."""
    yield from make_cluster(**options)
