"""The gang preflight's policy, pure (docs/preflight.md).

* ``nccl_output`` — ``all_reduce_perf`` output parsed as nccl-tests prints it, and why a
  run failed whatever its bandwidth;
* ``baseline`` — the busbw a run is held to, learned per node class and node count from
  the fleet's passing runs, one vote per user (an operator floor on top);
* ``judge`` — one all-reduce's report judged: passed, slow, failed or hung;
* ``pinning`` — a failed preflight pinned to the node(s) responsible: loopbacks, then
  halves and pairs, in rounds of disjoint groups;
* ``mode`` — whether an attempt runs the preflight (the job's choice, the cluster's
  default by job size).

The other layers: ``recovery.preflight`` (the rounds, the handover of pinned nodes to
the recovery loop) and ``repository.preflight`` (the preflight and baseline items).
"""
