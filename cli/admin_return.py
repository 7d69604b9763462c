"""``gpu-recovery-admin return-node``: a repaired QUARANTINED node, or a SUSPECT one, back to service.

    gpu-recovery-admin return-node --node-id <container-instance-id> [--reason TEXT] [--without-check]

By default the node goes back through the stack's own check, the lifecycle a lost node's
reconnect uses (``recovery.lost_node_checks``, ``domain.validation.SUSPECT_CHECKS``): one
conditional write opens its check (``Repair.OPERATOR``) on a SUSPECT (any origin) or
QUARANTINED node with no check open, and its ``validating`` cordon (``domain.cordon.check_cordon``,
with the cordon worklist's member: not counted by the cordon limit); the node is SUSPECT while
it runs (no queue work: the scheduler's admission skips SUSPECT nodes) and carries
``gpu-recovery.unavailable=validating`` (no work of any scheduler using the placement
constraint: the command puts it before it sets a DRAINING node ACTIVE, the sweep's worklist
puts it otherwise and confirms it), due at once, so the recovery sweep starts the validation
task within a minute once no rank holds its GPUs. A pass makes it AVAILABLE, its cordon
cleared; a failure keeps it SUSPECT for a person with the check's evidence and one e-mail,
never a failed repair, its cordon a known-bad ``cordoned`` one (the stack's own verdict); a
check that could not give an answer (stalled) lifts the cordon (a missing answer holds no
node) and goes on being tried. This command starts no ECS task.

``--without-check``: the operator vouches for the repair (parts replaced, field diagnostics
passed): one conditional write makes it AVAILABLE, its quarantine, suspect fields, cordon and
deadline cleared.

Either way a line joins the node's ``history`` (who, ``--reason``), and a node DRAINING in
ECS (a quarantine drains it: its check could not be placed) is set ACTIVE, after the write,
which marks that step pending (``ecs_activation_pending``, removed once it is confirmed): a
rerun finishes what a crashed run started, writes nothing again, and leaves alone a drain made
after the step was confirmed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpu_recovery import clock
from gpu_recovery.adapters.ecs import EcsAdapter
from gpu_recovery.constants import (
    DEFAULT_INSTANCE_TABLE_NAME,
    ENV_CLUSTER_NAME,
    ENV_INSTANCE_TABLE,
    ENV_POST_REPAIR_VALIDATION,
    InstanceState,
)
from gpu_recovery.domain import placement
from gpu_recovery.domain import validation as policy
from gpu_recovery.domain.cordon import check_cordon
from gpu_recovery.domain.models import Instance
from gpu_recovery.domain.validation import Repair
from gpu_recovery.repository.validations import ACTIVATION_PENDING, DEREGISTERED_AT, RETURNABLE_STATES

COMMAND = "return-node"
# What to do about a node in another state.
_OTHER_STATES = {
    InstanceState.AVAILABLE: "it is in service already",
    InstanceState.REBOOTING: "the stack is repairing it (a reboot, a GPU reset, its validation): wait for it",
    InstanceState.HEALTH_CHECK_PENDING: "its health check is due: wait for its verdict",
    InstanceState.HEALTH_CHECKING: "its health check is running: wait for its verdict",
}


class ReturnError(Exception):
    """The node cannot be returned: the message says why and what to do (exit 1)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", required=True, help="ECS container instance id of the node")
    parser.add_argument("--reason", default="", help="the repair made (kept in the node's history)")
    parser.add_argument("--without-check", action="store_true",
                        help="you vouch for the repair: AVAILABLE at once, no check by the stack")
    parser.add_argument("--instance-table", help=f"container-instance table (default ${ENV_INSTANCE_TABLE} "
                                                 f"or {DEFAULT_INSTANCE_TABLE_NAME})")
    parser.add_argument("--cluster", help=f"ECS cluster (default: the one in the node's ARN, else "
                                          f"${ENV_CLUSTER_NAME}, else the stack's ClusterName output)")
    parser.add_argument("--stack-name", default="GpuTrainingRecovery",
                        help="the deployed stack whose ClusterName output names the cluster, when nothing "
                             "else does (default GpuTrainingRecovery)")


def run(args: argparse.Namespace, ctx: Any) -> int:
    session = ctx.boto_session()
    return return_node_command(args, ctx.repository(), session.client("ecs"), now=clock.now(),
                               who=caller(session), stack_cluster=lambda: _stack_cluster(args, session))


def caller(session: Any) -> str:
    """Who returns the node: the caller's IAM identity (one STS call), else the login name."""
    try:
        return str(session.client("sts").get_caller_identity()["Arn"])
    except Exception:
        return os.environ.get("USER") or os.environ.get("USERNAME") or "operator"


def _stack_cluster(args: argparse.Namespace, session: Any) -> str:
    from cli.doctor.outputs import resolve_outputs

    found = resolve_outputs(argparse.Namespace(output=[], outputs_file=None, stack_name=args.stack_name),
                            session)
    return found.get("ClusterName", "")


def return_node_command(args: argparse.Namespace, repo: Any, ecs: Any, *, now: float, who: str,
                        stack_cluster: Callable[[], str] = lambda: "") -> int:
    """The intent (or nothing, on a rerun), then ECS ACTIVE; exit 1 with what to do when the
    node cannot be returned."""
    node = args.node_id
    try:
        check_policy = policy.ValidationPolicy.from_json(os.environ.get(ENV_POST_REPAIR_VALIDATION) or "")
    except policy.ValidationError as error:
        print(f"error: ${ENV_POST_REPAIR_VALIDATION}: {error}", file=sys.stderr)
        return 2
    raw = repo.instances.get_instance_item(node)
    if raw is None:
        print(f"error: no node {node!r} in the instance table {repo.tables.instance_table_name}: give its "
              "container-instance id (the last part of its ARN, `aws ecs list-container-instances`) and "
              "the stack's table (--instance-table)", file=sys.stderr)
        return 1
    instance = repo.instances.instance_from_item(raw)
    try:
        written = _write(args, repo, instance, raw, now=now, who=who, check_policy=check_policy)
    except ReturnError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(written or f"node {node} was returned already ({_already(instance)}): nothing written",
          file=sys.stderr)
    if not written and not raw.get(ACTIVATION_PENDING):
        return 0  # its ECS step was confirmed: a drain made since is not undone
    try:
        activated = _activate(ecs, instance, args.cluster or _cluster_of(instance) or stack_cluster,
                              lambda: (repo.instances.get_instance_item(node) or {}).get("cordon"))
    except Exception as error:
        print(f"error: the node's return is recorded, but setting it ACTIVE in ECS failed ({error}): run the "
              "same command again to finish", file=sys.stderr)
        return 1
    if activated:
        print(f"node {node} was DRAINING in ECS: set ACTIVE", file=sys.stderr)
    repo.validations.activation_done(node)  # if this fails, a rerun repeats the (idempotent) ECS step
    return 0


def _write(args: argparse.Namespace, repo: Any, instance: Instance, raw: Mapping[str, Any], *, now: float,
           who: str, check_policy: policy.ValidationPolicy) -> str | None:
    """The intent, once: what was done (None: a rerun, nothing written); ReturnError when the
    node cannot be returned (or changed meanwhile)."""
    node = instance.container_inst_id
    if _returned_already(instance, raw, bool(args.without_check)):
        return None
    _returnable(instance)
    if raw.get(DEREGISTERED_AT):
        raise ReturnError(f"node {node}'s container instance was deregistered from the cluster (found at "
                          f"{_when(raw.get(DEREGISTERED_AT))}): nothing to return; a host that registers "
                          "again is a new container instance, with an id of its own")
    reason = args.reason.strip() or "no reason given"
    if args.without_check:
        history = _history(instance, InstanceState.AVAILABLE, now, who,
                           f"returned to service by {who} without the stack's check: {reason}")
        if not repo.validations.return_without_check(instance, now, history):
            raise _changed(repo, node)
        return (f"node {node} returned to service without the stack's check: AVAILABLE"
                + (" (its cordon's ECS attribute goes within a minute)" if instance.cordoned else ""))
    what = f"returned by {who} for the stack's check: {reason}"
    if instance.state is InstanceState.QUARANTINED:
        what += f" (quarantined: {instance.quarantine_reason or 'no reason recorded'})"
    check = policy.SUSPECT_CHECKS[Repair.OPERATOR]
    record = policy.new_validation(Repair.OPERATOR, cause=check.cause, since=now, policy=check_policy)
    cordon = check_cordon(instance.cordon, repair=Repair.OPERATOR.value, now=now,
                          reason=f"{check.name}: validating ({check_policy.describe()})")
    if not repo.validations.open_operator_check(instance, record, now, origin=check.origin, cordon=cordon,
                                                history=_history(instance, InstanceState.SUSPECT, now, who,
                                                                 what)):
        raise _changed(repo, node)
    return (f"node {node} returned for the stack's check ({check_policy.describe()}): it stays SUSPECT (no "
            f"queue work) and cordoned ({placement.UNAVAILABLE_ATTRIBUTE}={placement.VALIDATING}: no "
            "other scheduler's work) until the check passes, then is AVAILABLE; the recovery sweep starts "
            "the check within a minute, once no rank holds its GPUs. A failed check keeps it SUSPECT and "
            "cordoned with the check's evidence (last_validation, last_verdict) and one validation_failed "
            "e-mail.")


def _returnable(instance: Instance) -> None:
    node, state = instance.container_inst_id, instance.state
    if state not in RETURNABLE_STATES:
        raise ReturnError(f"node {node} is {state.value}, not SUSPECT or QUARANTINED: "
                          f"{_OTHER_STATES.get(state, 'nothing to return')}")
    if instance.validation:
        repair = Repair(str(instance.validation.get("repair") or Repair.REBOOT.value))
        raise ReturnError(f"a check is already running on node {node} (after {repair.words}, since "
                          f"{_when(instance.validation.get('since'))}): wait for its result (the node's "
                          "last_validation), then return it if it still needs returning")
    if instance.terminate_pending or instance.replacement_watch:
        raise ReturnError(f"node {node} is being replaced (terminated in its Auto Scaling group): nothing "
                          "to return; the stack validates its replacement")
    if instance.breaker_blocked:
        raise ReturnError(f"the blast-radius breaker holds back {instance.breaker_blocked.get('action')} of "
                          f"node {node}: settle it first (gpu-recovery-admin breaker show / breaker reset)")


def _returned_already(instance: Instance, raw: Mapping[str, Any], without_check: bool) -> bool:
    """This command's write is there already: its check open (not asked to skip it), or the
    node AVAILABLE with this command's line last in its history."""
    if instance.state is InstanceState.SUSPECT and instance.validation.get("repair") == Repair.OPERATOR.value:
        return not without_check
    last = (list(raw.get("history") or []) or [{}])[-1]
    return instance.state is InstanceState.AVAILABLE and last.get("command") == COMMAND


def _already(instance: Instance) -> str:
    if instance.validating:
        return f"its check runs since {_when(instance.validation.get('since'))}"
    return "it is AVAILABLE"


def _history(instance: Instance, to: InstanceState, now: float, who: str, reason: str) -> dict[str, Any]:
    return {"at": now, "from": instance.state.value, "to": to.value, "reason": reason[:500], "actor": who,
            "command": COMMAND}


def _changed(repo: Any, node: str) -> ReturnError:
    fresh = repo.instances.get_instance(node)
    now_state = fresh.state.value if fresh is not None else "gone"
    return ReturnError(f"node {node} changed while returning it (now {now_state}): run the command again")


def _cluster_of(instance: Instance) -> str:
    """The cluster in the node's container-instance ARN (``.../container-instance/<cluster>/<id>``;
    "" for the old format without it)."""
    parts = instance.container_instance_arn.partition(":container-instance/")[2].split("/")
    return parts[0] if len(parts) == 2 else ""


def _activate(ecs: Any, instance: Instance, cluster: str | Callable[[], str],
              cordon_now: Callable[[], Mapping[str, Any] | None]) -> bool:
    """DescribeContainerInstances; DRAINING: the node's cordon put in ECS (``cordon_now``: as
    its item says now), then UpdateContainerInstancesState ACTIVE. True when set."""
    name = cluster if isinstance(cluster, str) else (os.environ.get(ENV_CLUSTER_NAME) or cluster())
    if not name:
        raise ReturnError("no ECS cluster known: give --cluster")
    target = instance.container_instance_arn or instance.container_inst_id
    described = ecs.describe_container_instances(cluster=name, containerInstances=[target])
    found = described.get("containerInstances") or []
    if not found:
        reasons = ", ".join(str(f.get("reason")) for f in described.get("failures") or []) or "not found"
        raise ReturnError(f"ECS cluster {name} does not know the node ({reasons}): is --cluster right?")
    if found[0].get("status") != "DRAINING":
        return False
    _put_cordon(ecs, name, target, cordon_now())
    answer = ecs.update_container_instances_state(cluster=name, containerInstances=[target], status="ACTIVE")
    if answer.get("failures"):
        raise ReturnError(f"ECS refused ACTIVE: {answer['failures']}")
    return True


def _put_cordon(ecs: Any, cluster: str, target: str, cordon: Mapping[str, Any] | None) -> None:
    """PutAttributes of the node's cordon (its check's ``validating``) before it leaves DRAINING,
    so no scheduler places on it between ACTIVE and the sweep's sync of the cordon worklist
    (which puts it again, idempotent, and confirms it). Only on a DRAINING node: no check ran
    there, so none passed and cleared the cordon this put would bring back. A failure is left
    to the sweep (a minute), never a reason to keep the node DRAINING."""
    put, _ = placement.attributes_wanted(cordon, None)
    if not cordon or not put:
        return
    try:
        EcsAdapter(ecs, cluster).put_attributes(target, put)  # the request as the sweep's sync makes it
    except Exception as error:
        print(f"warning: putting the node's {placement.UNAVAILABLE_ATTRIBUTE} attribute failed ({error}): "
              "the recovery sweep puts it within a minute", file=sys.stderr)


def _when(at: Any) -> str:
    try:
        return datetime.fromtimestamp(float(at), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError):
        return "an unknown time"
