"""The gang preflight (docs/preflight.md): ``rounds`` (what each rank runs, its reports
judged, the rounds of the pinning search, the end) and ``handover`` (the pinned nodes to
the recovery loop's node decision, cordon and reboot / reset / replace paths). The policy is
pure, in ``gpu_recovery.domain.preflight``; the items are ``repository.preflight``'s."""
