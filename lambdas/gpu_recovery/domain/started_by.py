"""The ``startedBy`` of every task the stack starts: deterministic, so that a start whose
answer was lost finds its task again (ListTasks by startedBy) instead of starting a second
one. ECS takes 36 characters at most.

Two shapes, each kept as tasks already running carry it (a task started before an upgrade
must still be found after it):

* a node task (a DCGM check, a GPU reset, a validation): its kind's prefix and a digest of
  what makes the start unique (the node, the decision or request it serves, the attempt);
  the checks started together on up to 10 nodes by one StartTask share one (its own prefix:
  a task of it is told from the others of the call by its container instance);
* a rank (or a call of identical ranks): the start fan-out's prefix (``RESTART``: a gang
  restart's and a queue launch's alike, the one launcher), a digest of the job id, the attempt
  and the rank (``r``) or the call (``g``).
"""

from __future__ import annotations

import hashlib

MAX_LENGTH = 36  # ECS StartTask's startedBy
# Each kind's prefix.
HEALTH_CHECK = "gpu-recovery-hc"
HEALTH_CHECK_GROUP = "gpu-recovery-hcg"  # the checks of one StartTask on several nodes
GPU_RESET = "gpu-recovery-reset"
VALIDATION = "gpu-recovery-val"
RESTART = "gpurec"  # every rank the start fan-out starts (a gang restart's, a queue launch's)
# The queue's launches before they went through the start fan-out: no task is started with it
# any more; kept so that tasks started before the upgrade are still known as the stack's.
QUEUE_LAUNCH = "q"
#: every kind's prefix: a task whose startedBy begins with one of them (and "-") is the stack's
PREFIXES = (HEALTH_CHECK, HEALTH_CHECK_GROUP, GPU_RESET, VALIDATION, RESTART, QUEUE_LAUNCH)
NODE_TASK_DIGEST = 16  # hex characters of a node task's digest


def is_restart(started_by: str) -> bool:
    """A rank the start fan-out started (a gang restart's or a queue launch's): the batch that
    registered its attempt's last rank told the launch or the restart."""
    return started_by.startswith(f"{RESTART}-")


def names_several_nodes(started_by: str) -> bool:
    """A startedBy one StartTask gave tasks on several nodes (a group of checks)."""
    return started_by.startswith(f"{HEALTH_CHECK_GROUP}-")


def node_task(prefix: str, *unique: object) -> str:
    """``prefix`` and the digest of ``unique`` (their ``str``, joined by ":")."""
    seed = ":".join(str(part) for part in unique)
    return f"{prefix}-{hashlib.sha256(seed.encode()).hexdigest()[:NODE_TASK_DIGEST]}"[:MAX_LENGTH]


def rank_launch(prefix: str, job_id: str, attempt: int, tail: str, *, digest: int) -> str:
    """``prefix``, ``digest`` hex characters of the job id's digest, the attempt and ``tail``
    (``r<rank>`` or ``g<call>``)."""
    job = hashlib.sha256(job_id.encode()).hexdigest()[:digest]
    return f"{prefix}-{job}-a{attempt}-{tail}"[:MAX_LENGTH]
