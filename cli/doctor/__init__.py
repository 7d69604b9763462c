"""``gpu-recovery-admin doctor``: is the live account ready for the first GPU fault?

Read-only. From the deployed stack's outputs (``--stack-name``, a ``cdk deploy
--outputs-file`` file, or ``--output KEY=VALUE``) it checks what the recovery loop needs
and prints one line per check, PASS / WARN / FAIL, with the fix under each failure:

* the ECS cluster exists, is ACTIVE and is the one you expect (``--cluster``);
* GPU container instances are registered (GPU count each) and carry the reboot tag the
  stack's IAM policy requires (EC2 tags; SSM tags for ECS Anywhere ``mi-`` hosts);
* ECS Anywhere hosts are reachable through SSM (how the stack reboots them);
* the health-check task definition is registered and ACTIVE, its image, its log group
  exists, and every GPU node has the GPUs it reserves;
* the alert topic has a confirmed subscription;
* every rule is enabled, has a dead-letter queue, and that queue is empty;
* the gang fan-out queue (a large job's stop / start batches) exists, sends what fails 5
  times to its dead-letter queue, which is empty, and its worker's event source mapping
  is enabled;
* point-in-time recovery is on for every table;
* node report tokens are issued for the registered nodes, and when each last reported;
* the blast-radius breaker is closed (a tripped breaker holds every node action back);
* no job is overdue: none of the jobs the recovery loop owns is 15 minutes or more past the
  deadline of its next step (read from the job table's deadline index, oldest first, no
  Scan); each is listed with its state, since when, and its last error.

Exit status 1 when a check fails (warnings do not fail). Credentials need read access
only (e.g. the ReadOnlyAccess managed policy).

Modules: ``command`` (:class:`Doctor`, the command's arguments and ``run``), ``nodes``
(the cluster and its GPU nodes), ``stack`` (the topic, rules, queues and tables),
``state`` (tokens, the breaker, overdue jobs: what the tables say), beneath them
``outputs`` (the stack's outputs, the account's clients) and ``findings``.
"""

from cli.doctor.command import Doctor, add_arguments, run
from cli.doctor.findings import FAIL, LISTED, PASS, SKIP, WARN, Finding, render
from cli.doctor.nodes import GpuNode
from cli.doctor.outputs import (
    DEFAULT_STACK_NAME,
    GANG_DLQ,
    GANG_QUEUE,
    GANG_WORKER,
    REQUIRED_OUTPUTS,
    TABLE_OUTPUTS,
    OutputsError,
    outputs_file,
    resolve_outputs,
    stack_outputs,
)

__all__ = [
    "DEFAULT_STACK_NAME",
    "FAIL",
    "GANG_DLQ",
    "GANG_QUEUE",
    "GANG_WORKER",
    "LISTED",
    "PASS",
    "REQUIRED_OUTPUTS",
    "SKIP",
    "TABLE_OUTPUTS",
    "WARN",
    "Doctor",
    "Finding",
    "GpuNode",
    "OutputsError",
    "add_arguments",
    "outputs_file",
    "render",
    "resolve_outputs",
    "run",
    "stack_outputs",
]
