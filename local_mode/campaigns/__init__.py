"""Crash campaigns: every flow of the stack, broken at each of its AWS calls in turn.

* ``recovery`` — one job's fault: GPU fault and reboot, fast path, dead GPU, application
  error, relocation (at once, spare first, after a wait), a job HELD by the breaker and
  the operator's reset, a gang above the inline fan-out;
* ``heartbeats`` — a node lost: its agent silent and its ECS agent disconnected; a wedged node:
  its host still reporting, its ECS agent away, then back and the stack's own check passing it;
* ``time_sharing`` — a preemption: suspend, go_suspend(), resume.

Each is a ``runner.Scenario`` (its world, its set-up, what it breaks in, its own expectations)
that ``runner.run_flow`` runs, checking what every flow owes (the backstop invariant after
every event, nothing pending, no event in a DLQ); ``runner.campaign`` runs a flow unbroken,
lists its positions and runs every broken position, each forked from the unbroken run by
``forked_runs.broken_runs``. ``catalog.RUNS`` maps a flow's name to its run (picklable: the
fork server's processes run it); ``python -m local_mode.campaigns FLOW...`` runs campaigns.
"""
