"""``SimulatedNodeAgents``: the GPU node agent of every simulated node, in simulated time.

Every ``interval`` simulated seconds each node that is up (not rebooting) POSTs
``/v1/report_tasks`` to the local API over real HTTP (``agent/gpu_node_agent.py``'s own
``post_json``: ``Authorization: Bearer <token>``, its User-Agent, its retry rules),
with the body the agent sends (agent/README.md): ``node_id`` = the container instance
id, ``timestamp`` = the node's clock (simulated time: the API checks it against
``gpu_recovery.clock.now()``, which the simulator drives) and every RUNNING task of
the node from the simulator, with a ``step`` counter per training task that advances
by one per report.

Scenario knobs:

* ``silence(node, start, end)``: the node's agent sends nothing in ``[start, end)``
  (network partition of the agent: ECS still sees the node);
* ``freeze_steps(job_id, rank, start, end)``: that rank keeps being reported but its
  step stops advancing (a hung rank).

A node with a driver warning injected (``SimulatedEcs.warn_gpu``: a recovery action, a pending
remap, a counter rising) also POSTs ``/v1/report_gpu`` each round, in the agent's body (its
GPU rows with ``recovery_action``, ``remapped_rows_pending`` and the counters), until the
warning is gone and reported so once: the other nodes' GPU reports (a write each) are left
out to keep the simulation cheap; XIDs reach the stack through ``inject_xid`` as before.

Tokens come from :class:`gpu_recovery.heartbeat.tokens.TokenStore` (what ``gpu-recovery-admin
issue-token`` uses), one per node. ``timeline`` holds what the agents did worth
showing; ``results`` counts accepted / rejected reports.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_recovery import constants as C
from local_mode.scripts import load_script

AGENT_PATH = Path(__file__).resolve().parents[1] / "agent" / "gpu_node_agent.py"


def load_agent_module() -> Any:
    """``agent/gpu_node_agent.py`` (a stand-alone script, not a package) as a module."""
    return load_script("gpu_node_agent", AGENT_PATH)


@dataclass
class _Window:
    start: float
    end: float

    def covers(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass
class AgentResults:
    accepted: int = 0
    rejected: list[tuple[float, str, int | None, str]] = field(default_factory=list)


class SimulatedNodeAgents:
    """See the module docstring."""

    def __init__(self, sim: Any, api_url: str, *, interval: float = 30.0,
                 issued_by: str = "local-mode") -> None:
        self.sim = sim
        self.api_url = api_url.rstrip("/")
        self.interval = float(interval)
        self.issued_by = issued_by
        self.agent = load_agent_module()
        # 30 s, not the agent's 10: the local API shares this machine's CPUs with the
        # simulation, and a report timed out once in a test run at a load average of 6
        self.config = self.agent.Config({"GPU_AGENT_API_URL": self.api_url,
                                         "GPU_AGENT_HTTP_TIMEOUT": "30",
                                         "GPU_AGENT_RETRY_BASE_SECONDS": "0"})
        self.tokens: dict[str, str] = {}
        self.steps: dict[str, int] = {}
        self.timeline: list[tuple[float, str, str, str]] = []  # (time, node, text, label)
        self.results = AgentResults()
        self._silent: dict[str, list[_Window]] = {}
        self._gpu_reporting: set[str] = set()  # nodes with a warning (or just past one)
        self._frozen: dict[tuple[str, str], list[_Window]] = {}
        self._started = False
        logging.getLogger("gpu-node-agent").setLevel(logging.CRITICAL)

    # ------------------------------------------------------------------ setup
    def issue_tokens(self) -> dict[str, str]:
        """One report token per node (the token module hashes and stores it)."""
        from gpu_recovery.adapters import aws
        from gpu_recovery.heartbeat.tokens import TokenStore

        table = aws.resource("dynamodb").Table(self.sim.local.node_token_table)
        store = TokenStore(table)
        for name in sorted(self.sim.nodes):
            if name not in self.tokens:
                node = self.sim.nodes[name]
                self.tokens[name] = store.issue(node.container_instance_id, issued_by=self.issued_by)
        return dict(self.tokens)

    def start(self, first_at: float | None = None) -> None:
        """Begin reporting (first round at ``first_at``, default now + interval)."""
        if self._started:
            return
        self._started = True
        self.issue_tokens()
        at = self.sim.now() + self.interval if first_at is None else first_at
        self.sim.schedule(at, self._round, "node agents")

    def silence(self, node: str, start: float, end: float, label: str = "") -> None:
        self._silent.setdefault(node, []).append(_Window(start, end))
        self.sim.schedule(start, lambda: self._note(node, "node agent goes silent (no reports)", label),
                          "agent silent")
        self.sim.schedule(end, lambda: self._note(node, "node agent reports again", label),
                          "agent back")

    def freeze_steps(self, job_id: str, rank: int, start: float, end: float, label: str = "") -> None:
        self._frozen.setdefault((job_id, str(rank)), []).append(_Window(start, end))
        who = f"rank {rank} of job {label or job_id}"
        self.sim.schedule(start, lambda: self._note_task(job_id, rank, f"{who}: step stops advancing "
                                                        "(heartbeats continue)", label), "freeze")
        self.sim.schedule(end, lambda: self._note_task(job_id, rank, f"{who}: step advances again",
                                                       label), "unfreeze")

    # ------------------------------------------------------------------ driving
    def _note(self, node: str, text: str, label: str = "") -> None:
        self.timeline.append((self.sim.now(), node, text, label))

    def _note_task(self, job_id: str, rank: int, text: str, label: str = "") -> None:
        node = next((t.node for t in self.sim.running_tasks()
                     if t.tags.get(C.TAG_JOB_ID) == job_id and t.tags.get(C.TAG_RANK) == str(rank)), "-")
        self._note(node, text, label)

    def is_silent(self, node: str, t: float) -> bool:
        return any(w.covers(t) for w in self._silent.get(node, ()))

    def _step_frozen(self, task: Any, t: float) -> bool:
        key = (task.tags.get(C.TAG_JOB_ID, ""), task.tags.get(C.TAG_RANK, ""))
        return any(w.covers(t) for w in self._frozen.get(key, ()))

    def _round(self) -> list[dict[str, Any]]:
        now = self.sim.now()
        for name in sorted(self.sim.nodes):
            node = self.sim.nodes[name]
            if node.rebooting or self.is_silent(name, now) or name not in self.tokens:
                continue
            self.report(name)
            if node.gpu_state or name in self._gpu_reporting:
                self.report_gpus(name)
        self.sim.schedule(now + self.interval, self._round, "node agents")
        return []

    def body(self, name: str) -> dict[str, Any]:
        """The agent's ``/v1/report_tasks`` body for this node, now."""
        now = self.sim.now()
        node = self.sim.nodes[name]
        tasks: list[dict[str, Any]] = []
        for task in sorted(self.sim.running_tasks(name), key=lambda t: t.arn):
            if task.last_status != "RUNNING":
                continue
            entry: dict[str, Any] = {"task_arn": task.arn}
            if not task.health_check:
                step = self.steps.get(task.arn, 0)
                if not self._step_frozen(task, now):
                    step += 1
                self.steps[task.arn] = step
                entry["step"] = step
            tasks.append(entry)
        return {"node_id": node.container_instance_id, "timestamp": now, "tasks": tasks}

    def report_gpus(self, name: str) -> Any:
        """``POST /v1/report_gpu`` of the node's GPUs as the agent sends it (its warnings
        included); one more report once they are gone, then none until the next warning."""
        node = self.sim.nodes[name]
        if node.gpu_state:
            self._gpu_reporting.add(name)
        else:
            self._gpu_reporting.discard(name)
        url = self.agent.join_url(self.api_url, "/v1/report_gpu")
        result = self.agent.post_json(url, self.sim.gpu_report_body(node), self.tokens[name],
                                      time.monotonic() + 5.0, self.config, time.monotonic, lambda _s: None)
        if not result.ok:
            self.results.rejected.append((self.sim.now(), name, result.status, result.error or ""))
        return result

    def report(self, name: str) -> Any:
        body = self.body(name)
        url = self.agent.join_url(self.api_url, "/v1/report_tasks")
        result = self.agent.post_json(url, body, self.tokens[name], time.monotonic() + 5.0,
                                      self.config, time.monotonic, lambda _s: None)
        if result.ok:
            self.results.accepted += 1
        else:
            self.results.rejected.append((self.sim.now(), name, result.status, result.error or ""))
        return result
