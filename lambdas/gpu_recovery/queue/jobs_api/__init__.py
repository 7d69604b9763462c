"""The jobs API's use cases behind ``handlers/jobs_api.py``, one module per concern:

* ``service`` — ``JobQueueService``, the façade the handler calls (builds ``JobsApiContext``, delegates)
* ``submit`` — a new job: authorization, AUTO priority, quota and capacity checks
* ``reads`` — one job, a page of jobs, a job's transitions
* ``logs`` — a rank's training log
* ``cancel`` — cancel a job (its ranks stopped, in batches for a large gang)
* ``suspension`` — suspend and resume by the job's owner
* ``quotas`` — node quotas (``gpu_recovery.queue.quotas`` keeps the quota book)
* ``context`` (what they share), ``ports``, ``capacity``, ``triggers`` (the scheduler's
  wake-up), ``errors`` (what the caller is shown)
"""
