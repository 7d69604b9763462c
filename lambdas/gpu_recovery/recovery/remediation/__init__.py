"""A node's remediation, decided by the fault catalog and carried out once.

* ``node_decision`` — :class:`~gpu_recovery.recovery.remediation.node_decision.NodeRemediation`:
  plan (evidence -> catalog -> escalation -> effects), the gate (the blast-radius breaker,
  the cordon limit), one commit with every waiting job, then the reboot, drain or
  termination; the fast path of a definitive fault; a fault recorded on a node it changed
  nothing on.
* ``job_settlement`` — what the decision does to each waiting job (verdict, outcome,
  budget), and the conclusion of a fault whose suspects were all found healthy.
* ``node_unreachable`` — a node lost with its ECS agent disconnected: the job failed; the node
  quarantined for a person if its node agent was silent too, else only flagged SUSPECT.
* ``notices`` — the e-mails each of these owes, built before its commit and owed in its
  transaction (``recovery.notices``: the outbox).

The node's remediation never depends on a job's budget: the budget only decides whether
the job restarts. docs/remediation.md tells the whole story.
"""
