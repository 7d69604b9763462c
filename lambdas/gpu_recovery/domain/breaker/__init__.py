"""The blast-radius breaker's policy, pure (the domain's half of the breaker).

* ``breaker`` — limits, the stored state (a sliding window of nodes acted on, the
  backlog of held-back actions), a node action asked (``record_action``), a released
  backlog entry admitted (``admit_release``), the operator's reset, the status.
* ``hold`` — a job that cannot move waits HELD while its node's reboot is held back
  (``BreakerHold``, ``judge_hold``).

The other layers: ``recovery.breaker`` (the gate every node action asks, the operations
the sweep and the admin CLI run, the held jobs) and ``repository.breaker`` (its item).
"""
