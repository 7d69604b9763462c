"""The blast-radius breaker in the recovery loop (its policy: ``domain.breaker``; its item:
``repository.breaker``).

* ``gate`` — :class:`~gpu_recovery.recovery.breaker.gate.NodeActionGate`, asked by every
  automatic reboot, replacement and quarantine; its answer is written in the caller's
  transaction; the trip e-mail.
* ``operations`` — what the sweep does with the breaker every minute (metrics, the
  released backlog) and the operator's reset (``gpu-recovery-admin breaker reset``).
* ``held_jobs`` — jobs that wait HELD for a node whose reboot the breaker held back.
"""
