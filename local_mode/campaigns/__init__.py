"""Crash campaigns: every flow of the stack, broken at each of its AWS calls in turn.

* ``recovery`` — one job's fault: GPU fault and reboot, fast path, dead GPU, application
  error, relocation (at once, spare first, after a wait), a job HELD by the breaker and
  the operator's reset, a gang above the inline fan-out;
* ``heartbeats`` — a node lost: its agent silent and its ECS agent disconnected;
* ``time_sharing`` — a preemption: suspend, go_suspend(), resume.

``base`` holds what they share (the backstop invariant watched after every event, the
e-mails, the positions to break); ``local_mode.faults.broken_runs`` forks the broken runs
from each flow's unbroken run. ``RUNS`` maps a flow's name to its run (picklable: the fork
server's processes run it); ``python -m local_mode.campaigns FLOW...`` runs campaigns.
"""
