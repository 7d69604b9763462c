"""``POST /local/faults``: the faults the playground injects into its simulated cluster
(``gpu-recovery-admin inject-fault``): an XID, a dead GPU, a flapping ECS agent, an
application error, a node whose agent goes silent, the driver's warnings on a GPU that still
runs (its recovery action, a pending row remap, a counter rising) and, for the gang preflight,
a link between two nodes degraded or a node slow under load (``sim.fabric``: the all-reduces
holding them measure less; a reboot heals them unless ``persistent``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpu_recovery import constants as C
from local_mode.playground.config import PlaygroundError
from local_mode.playground.console import iso
from local_mode.training_programs import TrainingPrograms

# AWS's notices (docs/aws-notices.md): the event EC2 or AWS Health sends, on the simulated bus.
NOTICE_KINDS = ("capacity_block_expiry", "spot_interruption", "scheduled_maintenance")
FAULT_KINDS = ("xid", "dead_gpu", "flap", "app_error", "lost_node", "recovery_action", "remap_pending",
               "rising_counter", "link", "slow_node", *NOTICE_KINDS)
# The driver's recovery actions as the playground's CLI names them -> as the agent reports them.
RECOVERY_ACTIONS = {"reset": "gpu_reset", "reboot": "node_reboot", "drain-p2p": "drain_p2p",
                    "drain-and-reset": "drain_and_reset"}
COUNTERS = ("nvlink_replay_errors", "nvlink_recovery_errors", "nvlink_crc_errors", "ecc_corrected_volatile")
# What a health check finds after an XID, by the fault catalog's class of it: application
# errors leave the GPU healthy, XID 64 (row-remap failure) needs a new node, the catalog's
# reset XIDs are fixed by a GPU reset, the rest by a reboot (``persistent``: they are not).
APPLICATION_XIDS = frozenset({13, 31, 43, 94})
REPLACE_XIDS = frozenset({64})


def _reset_xids() -> frozenset[int]:
    """XIDs the default catalog answers with a GPU reset: a reset clears them here."""
    from gpu_recovery.domain.fault_catalog import default_catalog
    from gpu_recovery.domain.fault_vocabulary import Action

    return frozenset(x for rule in default_catalog().rules if rule.action is Action.RESET_GPU
                     for x in rule.match.xids)
CUDA_ERRORS = {
    13: "an illegal instruction was encountered", 31: "an illegal memory access was encountered",
    43: "unspecified launch failure", 48: "uncorrectable ECC error encountered",
    64: "uncorrectable ECC error encountered", 79: "unspecified launch failure",
    94: "uncorrectable ECC error encountered",
}


class FaultInjector:
    """Injects a fault now into the simulated cluster (``sim``), its training programs
    (the crash they log) and node agents; says what it did on the console (``note``)."""

    def __init__(self, sim: Any, programs: TrainingPrograms, agents: Any,
                 note: Callable[[str, str], None], repo: Any = None) -> None:
        self.sim = sim
        self.programs = programs
        self.agents = agents
        self.note = note
        self.repo = repo  # the stack's tables (read only): which jobs exist, which ranks are watched

    def _target(self, doc: dict[str, Any]) -> tuple[Any, Any]:
        """(node, the rank's task or None) named by ``node``, or by ``job_id`` + ``rank``."""
        node_ref, job_id = doc.get("node"), doc.get("job_id")
        if bool(node_ref) == bool(job_id):
            raise PlaygroundError("name either node or job_id (with rank)", field="node")
        if node_ref:
            try:
                return self.sim.node(str(node_ref)), None
            except KeyError:
                raise PlaygroundError(f"no node {node_ref} (nodes: {', '.join(sorted(self.sim.nodes))})",
                                      field="node", status=404) from None
        rank = _int(doc, "rank", 0)
        if self.repo is not None and self.repo.jobs.get_job(str(job_id)) is None:
            raise PlaygroundError(f"job {job_id} not found (gpujobs list shows the jobs)", field="job_id",
                                  status=404)
        tasks = [t for t in self.sim.running_tasks() if not t.health_check
                 and t.tags.get(C.TAG_JOB_ID) == job_id and t.tags.get(C.TAG_RANK) == str(rank)]
        if not tasks:
            raise PlaygroundError(f"job {job_id} has no rank {rank} on a node now (not started, between "
                                  "attempts, or ended)", field="job_id", status=404)
        task = max(tasks, key=lambda t: int(t.tags.get(C.TAG_ATTEMPT, "0") or 0))
        return self.sim.nodes[task.node], task

    def inject(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Inject the fault ``doc`` describes, now; returns what was done."""
        kind = str(doc.get("kind") or "").replace("-", "_")
        if kind not in FAULT_KINDS:
            raise PlaygroundError(f"kind: one of {', '.join(FAULT_KINDS)}", field="kind")
        node, task = self._target(doc)
        if kind == "xid":
            xid = _int(doc, "xid", None)
            if xid is None or not 1 <= xid <= 999:
                raise PlaygroundError("xid: an XID number (1..999), e.g. 79", field="xid")
            gpu = self._gpu(doc, node)
            health = self._health(doc, "replace" if xid in REPLACE_XIDS else
                                  "healthy" if xid in APPLICATION_XIDS else
                                  "reset_fixable" if xid in _reset_xids() else "reboot_fixable")
            crash = f"RuntimeError: CUDA error: {CUDA_ERRORS.get(xid, 'unspecified launch failure')} " \
                    f"(GPU {gpu}; the kernel log has Xid {xid})"
            self.programs.mark_crash(node.name, crash, "NCCL error: remote process exited or there was a "
                                                       "network error (a peer rank died)")
            unheld = _int(doc, "repair_does_not_hold", 0)
            if unheld is None or not 0 <= unheld <= 5:
                raise PlaygroundError("repair_does_not_hold: 0..5 repairs", field="repair_does_not_hold")
            if unheld:
                self.sim.repair_does_not_hold(node.name, unheld)
            self.sim.inject_xid(node.name, xid, gpu=gpu, health=health, nccl_cascade=True)
            detail = (f"XID {xid} on GPU {gpu} of {node.name}: the node agent reports it within a second, "
                      f"the ranks there crash 3 s later (a health check would find the node {health})")
            if unheld:
                detail += (f"; its next {unheld} repair(s) will not hold: it passes idle checks after each "
                           "and fails again under load (its validation after repair catches it)")
        elif kind == "dead_gpu":
            gpu = self._gpu(doc, node)
            self.programs.mark_crash(
                node.name, f"RuntimeError: CUDA error: uncorrectable ECC error encountered (GPU {gpu})",
                "NCCL error: remote process exited or there was a network error (a peer rank died)")
            self.sim.inject_gpu_fault(node.name, health="replace", exit_code=1, nccl_cascade=True)
            detail = (f"GPU {gpu} of {node.name} is dead: its ranks exit 1 now, the DCGM diag will say "
                      "replace")
        elif kind == "flap":
            seconds = _number(doc, "seconds", 30.0, 5, 3600)
            times = int(_number(doc, "times", 3, 1, 20))
            for i in range(times):
                self.sim.disconnect_agent(node.name, after=i * 2 * seconds, for_seconds=seconds)
            detail = (f"the ECS agent of {node.name} disconnects {times} time(s) for {seconds:g} s, "
                      f"{2 * seconds:g} s apart (the tasks keep running)")
        elif kind == "app_error":
            if task is None:
                running = [t for t in self.sim.running_tasks(node.name) if not t.health_check]
                if not running:
                    raise PlaygroundError(f"nothing runs on {node.name}", field="node", status=404)
                task = running[0]
            exit_code = _int(doc, "exit_code", 1)
            if exit_code is None or not 1 <= exit_code <= 255:
                raise PlaygroundError("exit_code: 1..255", field="exit_code")
            self.programs.death_causes[task.arn] = (
                f"Traceback (most recent call last): ... ValueError: loss is NaN; exiting with status "
                f"{exit_code}")
            self.sim.inject_task_exit(task.arn, exit_code, after=0, why="application error injected")
            detail = (f"{task.label} on {node.name} exits {exit_code} (an application error: the GPUs are "
                      "healthy)")
        elif kind == "link":
            peer = self._peer(doc, node)
            factor = _number(doc, "factor", 0.3, 0.01, 1.0)
            persistent = bool(doc.get("persistent"))
            self.sim.fabric.degrade_link(node.name, peer.name, factor, persistent=persistent)
            heals = "a reboot does not heal it" if persistent else "a reboot of either heals it"
            detail = (f"the link between {node.name} and {peer.name} is degraded to {factor:.0%} of its "
                      f"bandwidth (nothing crashes: a gang preflight holding both nodes measures it; "
                      f"{heals})")
        elif kind == "slow_node":
            factor = _number(doc, "factor", 0.4, 0.01, 1.0)
            persistent = bool(doc.get("persistent"))
            if doc.get("network"):
                self.sim.fabric.slow_network(node.name, factor, persistent=persistent)
                what = "its network path (every all-reduce holding it and another node)"
            else:
                self.sim.fabric.slow_node(node.name, factor, persistent=persistent)
                what = "its GPUs under load (its loopback and every all-reduce holding it)"
            detail = (f"{node.name} is slow: {what} at {factor:.0%} of the healthy bandwidth; nothing "
                      "crashes, a gang preflight measures it")
        elif kind in ("recovery_action", "remap_pending", "rising_counter"):
            detail = self._warning(kind, doc, node)
        elif kind in NOTICE_KINDS:
            detail = self._notice(kind, doc, node)
        else:  # lost_node
            seconds = _number(doc, "seconds", 300.0, 10, 86400)
            self._refuse_unwatched(node)
            now = self.sim.now()
            self.agents.silence(node.name, now, now + seconds)
            detail = (f"the node agent of {node.name} sends nothing for {seconds:g} s (ECS still sees the "
                      "node): its ranks miss their heartbeats")
        self.note("admin", f"fault injected: {detail}")
        return {"kind": kind, "node": node.name, "container_instance_id": node.container_instance_id,
                "at": iso(self.sim.now()), "detail": detail}

    def _warning(self, kind: str, doc: dict[str, Any], node: Any) -> str:
        """The driver warns about a GPU that still runs: the node agent reports it with its
        next GPU report (every 30 s), the recovery sweep acts within a minute after."""
        gpu = self._gpu(doc, node)
        every = int(getattr(self.agents, "interval", 30))
        then = (f"the node agent reports it within {every} s; an idle node is then repaired, a busy one "
                "cordoned and its queue jobs asked to checkpoint and move (gpujobs watch)")
        if kind == "recovery_action":
            action = str(doc.get("action") or "").lower()
            if action not in RECOVERY_ACTIONS:
                raise PlaygroundError(f"action: one of {', '.join(RECOVERY_ACTIONS)}", field="action")
            self.sim.warn_gpu(node.name, gpu=gpu, recovery_action=RECOVERY_ACTIONS[action])
            return f"GPU {gpu} of {node.name}: the driver's recovery action is now {action}; {then}"
        if kind == "remap_pending":
            self.sim.warn_gpu(node.name, gpu=gpu, remap_pending=True)
            return f"GPU {gpu} of {node.name}: a row remap is pending (applied at the next reset); {then}"
        counter = str(doc.get("counter") or "").replace("-", "_")
        if counter not in COUNTERS:
            raise PlaygroundError(f"counter: one of {', '.join(COUNTERS)}", field="counter")
        per_hour = _number(doc, "per_hour", 600.0, 0.1, 1e9)
        self.sim.warn_gpu(node.name, gpu=gpu, counter=counter, per_hour=per_hour)
        return (f"GPU {gpu} of {node.name}: {counter} rising {per_hour:g}/h (the catalog acts past its rate, "
                f"over 10 to 20 min of reports; below it, nothing happens); {then}")

    def _notice(self, kind: str, doc: dict[str, Any], node: Any) -> str:
        """AWS announces the node goes away (``sim.aws_notices``): the event now, the node taken
        at its deadline (what still runs there ends; a reboot maintenance reboots it)."""
        from local_mode.sim.aws_notices import announce

        lead = _number(doc, "lead_seconds", 2 * 24 * 3600.0, 60, 30 * 24 * 3600) \
            if kind == "scheduled_maintenance" else None
        sent = announce(self.sim, "scheduled_retirement" if doc.get("retirement") else kind, node.name,
                        lead_seconds=lead)
        what = {"capacity_block_expiry": "its Capacity Block's expiration warning (40 min before the end)",
                "spot_interruption": "a Spot interruption warning (2 min)",
                "scheduled_maintenance": "an AWS Health scheduled event"}[kind]
        return (f"{what} for {', '.join(sent['nodes'])}: AWS takes the node(s) at {iso(sent['deadline'])}; "
                "the stack cordons them at once (aws-notice) and asks their queue jobs to checkpoint and "
                "move (gpujobs watch)")

    def _refuse_unwatched(self, node: Any) -> None:
        """A silent node is noticed through its ranks' heartbeats: the heartbeat sweep watches
        a rank once the node agent reported it. Silencing a node none of whose ranks was
        reported yet (or that runs none) would change nothing: say so instead."""
        ranks = [(t.tags.get(C.TAG_JOB_ID), t.tags.get(C.TAG_RANK)) for t in self.sim.running_tasks(node.name)
                 if not t.health_check and t.tags.get(C.TAG_JOB_ID)]
        if not ranks:
            raise PlaygroundError(f"nothing runs on {node.name}: a lost node is noticed through the "
                                  "heartbeats of the ranks it runs (submit a job first)", field="node",
                                  status=409)
        if self.repo is None:
            return
        for job_id, rank in ranks:
            found = self.repo.jobs.get_rank(str(job_id), int(rank or 0))
            if found is not None and found.last_heartbeat_at is not None:
                return
        every = int(getattr(self.agents, "interval", 30))
        raise PlaygroundError(
            f"the ranks on {node.name} ({', '.join(f'{j} rank {r}' for j, r in ranks)}) have sent no "
            f"heartbeat yet (the node agent reports every {every} s): nothing would notice the node "
            "going silent; try again once the first report is in (gpujobs show <job id>: LAST HEARTBEAT)",
            field="node", status=409)

    def _peer(self, doc: dict[str, Any], node: Any) -> Any:
        ref = doc.get("peer")
        if not ref and doc.get("job_id") and doc.get("peer_rank") is not None:
            _, task = self._target({"job_id": doc["job_id"], "rank": doc["peer_rank"]})
            ref = task.node if task is not None else None
        if not ref:
            raise PlaygroundError("peer: the link's other node (node-2...), or peer_rank with job_id",
                                  field="peer")
        try:
            peer = self.sim.node(str(ref))
        except KeyError:
            raise PlaygroundError(f"no node {ref} (nodes: {', '.join(sorted(self.sim.nodes))})", field="peer",
                                  status=404) from None
        if peer.name == node.name:
            raise PlaygroundError("peer: a link joins two different nodes", field="peer")
        return peer

    def _gpu(self, doc: dict[str, Any], node: Any) -> int:
        gpu = _int(doc, "gpu", 0)
        if gpu is None or not 0 <= gpu < len(node.gpu_ids):
            raise PlaygroundError(f"gpu: 0..{len(node.gpu_ids) - 1}", field="gpu")
        return gpu

    @staticmethod
    def _health(doc: dict[str, Any], default: str) -> str:
        from local_mode.health_verdicts import HEALTH_VALUES

        if doc.get("persistent"):
            return "persistent_reboot"
        health = str(doc.get("health") or default)
        if health not in HEALTH_VALUES:
            raise PlaygroundError(f"health: one of {', '.join(HEALTH_VALUES)}", field="health")
        return health



def _int(doc: dict[str, Any], name: str, default: int | None) -> int | None:
    value = doc.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).lstrip("-").isdigit():
        raise PlaygroundError(f"{name}: an integer", field=name)
    return int(value)


def _number(doc: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = doc.get(name, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise PlaygroundError(f"{name}: a number", field=name) from None
    if isinstance(value, bool) or not low <= number <= high:
        raise PlaygroundError(f"{name}: {low:g}..{high:g}", field=name)
    return number
