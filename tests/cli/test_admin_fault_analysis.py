"""``gpu-recovery-admin faults``: every suspect node of a job's fault, from the job table."""

from __future__ import annotations

import json

from cli import admin
from tests.recovery.fakes import world


def test_faults_lists_every_suspect_node_of_the_fault(capsys) -> None:
    with world(max_health_checks_per_job=8, check_all_nodes_on_fault=True) as w:
        nodes = [f"node-{i}" for i in range(3)]
        arns = w.register_job("j", nodes)
        for arn in arns:  # an NCCL cascade: each node a suspect
            w.service.on_task_state_change(w.task_stopped(arn, exit_code=1))
        assert admin.main(["faults", "--job-id", "j", "--json"], repo=w.repo) == 0
        shown = json.loads(capsys.readouterr().out)
        assert [n["node"] for n in shown["nodes"]] == nodes
        assert {n["verdict"] for n in shown["nodes"]} == {"PENDING"}
        assert shown["tally"]["total"] == 3 and shown["attempt"] == 1
        assert admin.main(["faults", "--job-id", "j"], repo=w.repo) == 0
        table = capsys.readouterr().out
        assert "node-2" in table and "total 3" in table
        assert admin.main(["faults", "--job-id", "nope"], repo=w.repo) == 1
