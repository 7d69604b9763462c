"""Checks of what the tables say: node report tokens and when each node last reported, the
blast-radius breaker, jobs overdue (read from the deadline index, oldest first, no Scan)."""

from __future__ import annotations

import itertools
from typing import Any

from botocore.config import Config

from cli.doctor.findings import FAIL, LISTED, PASS, SKIP, WARN, Finding, ago, listing
from cli.doctor.nodes import NodeChecks
from gpu_recovery.constants import DEADLINE_SK
from gpu_recovery.domain.overdue import OVERDUE_AFTER_SECONDS, overdue_cutoff
from gpu_recovery.heartbeat.tokens import ACTIVE, STATUS_ATTR, TokenStore
from gpu_recovery.repository import Repository
from gpu_recovery.repository.heartbeat import HeartbeatRepository

DEFAULT_STALE_SECONDS = 180
# Overdue jobs: one line each for the oldest few; the deadline index is read a page at a
# time, at most this many pages (the rest is counted as "or more").
OVERDUE_PAGE, OVERDUE_MAX_PAGES = 100, 10
OVERDUE_RUNBOOK = "docs/operations.md 'Overdue jobs'"


class StateChecks(NodeChecks):
    # ------------------------------------------------------------------ node tokens
    def check_node_tokens(self) -> list[Finding]:
        if not self._cluster_ok:
            return [Finding("node tokens", SKIP, "cluster not found")]
        resource = self.session.resource("dynamodb", config=Config(retries={"mode": "standard"}))
        store = TokenStore(resource.Table(self.out("NodeTokenTableName")))
        active = {str(i.get("node_id")) for i in store.list() if i.get(STATUS_ATTR) == ACTIVE}
        nodes = [n.container_instance_id for n in self.gpu_nodes()]
        if not nodes:
            return [Finding("node tokens", SKIP, "no GPU instances")]
        issue = (f"gpu-recovery-admin issue-token --table {self.out('NodeTokenTableName')} --node-id <id> "
                 "on each node (agent/README.md)")
        with_token = [n for n in nodes if n in active]
        if not with_token:
            return [Finding("node tokens", WARN, f"none of the {len(nodes)} GPU nodes has a report token: "
                            "node heartbeats (NODE_LOST, HUNG, hardware signals) are off", issue)]
        findings = []
        without = [n for n in nodes if n not in active]
        if without:
            findings.append(Finding("node tokens", FAIL, f"{len(without)} of {len(nodes)} GPU nodes have no "
                                    f"report token: {listing(without)}", issue))
        repo = HeartbeatRepository(Repository(resource, self.out("JobTableName") or "-",
                                              self.out("InstanceTableName")))
        items = repo.node_items(with_token)
        stale_after = float(self.out("HeartbeatStaleSeconds") or DEFAULT_STALE_SECONDS)
        now, reports, silent = self.now(), [], []
        for node in with_token:
            last = (items.get(node) or {}).get("last_report_at")
            if last is None:
                silent.append(f"{node} (never reported)")
                continue
            age = now - float(last)
            reports.append(f"{node} {ago(age)}")
            if age > stale_after:
                silent.append(f"{node} (last report {ago(age)})")
        if silent:
            findings.append(Finding("node tokens", WARN, f"{len(silent)} node(s) with a token are not "
                                    f"reporting: {listing(silent)}",
                                    "check the node agent (systemctl status gpu-node-agent) and "
                                    "its token file"))
        if not without:
            findings.insert(0, Finding("node tokens", PASS, f"all {len(nodes)} GPU nodes have a token; "
                                       f"last reports: {listing(reports) or 'none yet'}"))
        return findings

    # ------------------------------------------------------------------ breaker
    def check_breaker(self) -> list[Finding]:
        from gpu_recovery.domain.breaker import breaker

        resource = self.session.resource("dynamodb", config=Config(retries={"mode": "standard"}))
        repo = Repository(resource, self.out("JobTableName") or "-", self.out("InstanceTableName"))
        stored = repo.breaker.read()
        state = breaker.normalize(stored)
        if state["state"] != breaker.TRIPPED:
            acted = "never acted" if stored is None else f"tripped {state['trips']} time(s) so far"
            return [Finding("breaker", PASS, f"closed ({acted})")]
        held = sorted({str(e.get("node")) for e in state["backlog"]})
        return [Finding("breaker", FAIL, f"tripped ({state['trip_reason'] or 'no reason recorded'}): node "
                        f"actions are held back; backlog: {listing(held) or 'empty'}",
                        "find the common cause (a driver or image rollout?) with `gpu-recovery-admin "
                        "breaker show`, then `gpu-recovery-admin breaker reset --resume-backlog` "
                        "(or --drop-backlog); docs/remediation.md")]

    # ------------------------------------------------------------------ overdue jobs
    def check_overdue_jobs(self) -> list[Finding]:
        """Jobs whose next step is long past due: the deadline index up to the cutoff,
        oldest first (only overdue items are read)."""
        resource = self.session.resource("dynamodb", config=Config(retries={"mode": "standard"}))
        repo = Repository(resource, self.out("JobTableName"), self.out("InstanceTableName") or "-")
        now = self.now()
        jobs: list[dict[str, Any]] = []
        last_page_full = False  # then there may be more than were read
        for page in itertools.islice(repo.deadlines.due_job_item_pages(overdue_cutoff(now), OVERDUE_PAGE),
                                     OVERDUE_MAX_PAGES):
            jobs += [item for item in page if item.get("item_type") == "JOB"]
            last_page_full = len(page) == OVERDUE_PAGE
        margin = f"{OVERDUE_AFTER_SECONDS // 60} min"
        if not jobs:
            return [Finding("overdue jobs", PASS, f"none: every job in recovery is within {margin} of its "
                            "next step's deadline")]
        fix = (f"nothing has moved these jobs on for {margin}: check that the recovery sweep runs (rule "
               "RecoverySweep above, its Errors alarm), read its ERROR lines 'sweep step failed' (the "
               "failed call's traceback), fix the cause: the next sweep goes on by itself; else settle "
               f"the job by hand ({OVERDUE_RUNBOOK})")
        findings: list[Finding] = []
        for item in jobs[:LISTED]:
            late = now - float(item.get(DEADLINE_SK) or now)
            history = item.get("history") or [{}]
            why = str(item.get("last_error") or history[-1].get("reason") or "no error recorded")
            state = f"{item.get('job_state')} (attempt {item.get('attempt', 1)})"
            findings.append(Finding("overdue jobs", FAIL, f"{item.get('job_id')}: {state}, next step due "
                                    f"{ago(late)}; last error: {why[:200]}", fix if not findings else ""))
        if len(jobs) > LISTED:
            more = f"{len(jobs) - LISTED}{' or more' if last_page_full else ''}"
            findings.append(Finding("overdue jobs", FAIL, f"and {more} more job(s) overdue"))
        return findings
