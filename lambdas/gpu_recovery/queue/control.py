"""The job-control channel of training code (the suspend contract of the seed).

A queue job's ranks carry ``GPU_RECOVERY_CONTROL_URL`` and their own
``GPU_RECOVERY_CONTROL_TOKEN`` (``domain.control_token``); ``gpu_recovery_client`` calls:

* ``receive_suspend_command()`` -> ``GET /v1/control``: True for **rank 0 only**, while the
  job is SUSPENDING (the scheduler preempted it, its owner suspended it): checkpoint now;
* ``go_suspend()`` -> ``POST /v1/control/suspend``: any rank; the job is suspended at once
  (every rank stopped; SUSPENDED once all stopped, then queued again or held);
* ``preflight`` (the wrapper before the training command) -> ``GET /v1/control/preflight``:
  what this rank runs now (its loopback, its group's all-reduce, nothing, its command, or
  stop), and ``POST /v1/control/preflight``: an all-reduce's output, judged where it lands
  (``recovery.preflight``).

Why through the API and not the node agent: the agent is optional and reports every 30 s
(each report a write), while the seed's contract is "rank 0 knows within 5 s"; a poll
here is one GetItem, and the client shares one poll per interval between the processes
of a container.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from gpu_recovery import clock
from gpu_recovery.domain.control_token import authorize
from gpu_recovery.domain.states import JobState

if TYPE_CHECKING:
    from gpu_recovery.recovery.ports import Outcome


class ControlError(Exception):
    """What the control API answers with a 4xx (status, code, message)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class JobControlData(Protocol):
    """The job item a rank asks about, and the checkpoint it reports."""

    def get_job_item(self, job_id: str) -> dict[str, Any] | None: ...
    def record_checkpoint(self, job_id: str, attempt: int, step: int, now: float) -> bool: ...


class JobControlService:
    def __init__(self, repo: JobControlData, go_suspend: Callable[[str, int, int | None], Outcome],
                 poll_seconds: int = 2, *, secrets: Callable[[str], str],
                 preflights: Callable[[], Any] | None = None) -> None:
        self.repo = repo
        self._secrets = secrets  # job id -> its control secret ("": none)
        self._go_suspend = go_suspend  # RecoveryService.go_suspend
        self.poll_seconds = poll_seconds
        self._preflights = preflights  # -> RecoveryService.preflights (built when first needed)

    def authorize(self, token: str) -> tuple[str, int] | None:
        """(job id, rank) of a valid token, else None (the authorizer's check, which the
        authorizer makes on ``ControlSecrets`` alone)."""
        return authorize(token, self._secrets)

    def status(self, job_id: str, rank: int, attempt: int | None = None) -> dict[str, Any]:
        """What rank ``rank`` of ``job_id`` should do now."""
        item = self._job(job_id)
        state = JobState(item["job_state"])
        current = int(item.get("attempt") or 0)
        suspend = dict(item.get("suspend") or {}) if state is JobState.SUSPENDING else {}
        stale = attempt is not None and attempt != current
        told = bool(suspend) and rank == 0 and not stale
        return {
            "job_id": job_id, "rank": rank, "attempt": current, "state": state.value,
            "suspend": told,
            "deadline_at": suspend.get("deadline_at") if told else None,
            "grace_seconds": suspend.get("grace_seconds") if told else None,
            "reason": str(suspend.get("reason") or "") if told else "",
            "poll_seconds": self.poll_seconds,
        }

    def go_suspend(self, job_id: str, rank: int, attempt: int | None = None) -> dict[str, Any]:
        item = self._job(job_id)
        current = int(item.get("attempt") or 0)
        if attempt is not None and attempt != current:
            raise ControlError(409, "stale_attempt",
                               f"attempt {attempt} of job {job_id} is over (the job is at attempt {current})")
        outcome = self._go_suspend(job_id, rank, attempt)
        fresh = self._job(job_id)
        state = str(fresh["job_state"])
        # 200 only for a job being suspended (its ranks will be stopped: the client waits for
        # that), whatever the outcome said: a job RUNNING again (a move declined under the call)
        # is refused, never answered with nothing to stop it.
        if state not in (JobState.SUSPENDING.value, JobState.SUSPENDED.value):
            raise ControlError(409, "not_running",
                               f"job {job_id} is {state}: not suspended (only a RUNNING or SUSPENDING job "
                               "can be suspended)")
        return {"job_id": job_id, "rank": rank, "state": state,
                "stopping_ranks": list(outcome.detail.get("stopping_ranks") or [])}

    def checkpoint_saved(self, job_id: str, rank: int, attempt: int, step: int) -> dict[str, Any]:
        """Rank 0 saved a checkpoint at ``step``: the job's ledger measures a fault's lost
        work from it (``domain.goodput``). Other ranks are refused (one report per save)."""
        if rank != 0:
            raise ControlError(409, "not_rank_0", "only rank 0 reports checkpoints")
        recorded = self.repo.record_checkpoint(job_id, attempt, step, clock.now())
        if not recorded:
            item = self._job(job_id)
            current = int(item.get("attempt") or 0)
            if attempt != current:
                raise ControlError(409, "stale_attempt", f"attempt {attempt} of job {job_id} is over "
                                                         f"(the job is at attempt {current})")
        return {"job_id": job_id, "attempt": attempt, "step": step, "recorded": recorded}

    def preflight_step(self, job_id: str, rank: int, attempt: int) -> dict[str, Any]:
        """What rank ``rank`` of ``attempt`` does now in its gang preflight (the token was
        checked against the job item; the preflight reads it when it needs it)."""
        return dict(self._preflight_service().step(job_id, rank, attempt))

    def preflight_report(self, job_id: str, rank: int, attempt: int, *, round_: int, test_id: str,
                         exit_code: int | None, output: str, seconds: float | None = None,
                         address: str = "") -> dict[str, Any]:
        """An all-reduce this rank ran (its loopback, or its group's as the group's leader)."""
        # Imported with the recovery service that raises it: the control API's polls load
        # neither.
        from gpu_recovery.recovery.preflight.rounds import PreflightError

        try:
            return dict(self._preflight_service().report(
                job_id, rank, attempt, round_=round_, test_id=test_id, exit_code=exit_code, output=output,
                seconds=seconds, address=address))
        except PreflightError as error:
            raise ControlError(error.status, error.code, error.message) from None

    def _preflight_service(self) -> Any:
        if self._preflights is None:
            raise ControlError(501, "not_configured", "this deployment runs no gang preflight")
        return self._preflights()

    def _job(self, job_id: str) -> Mapping[str, Any]:
        item = self.repo.get_job_item(job_id)
        if item is None or item.get("item_type", "JOB") != "JOB":
            raise ControlError(404, "not_found", f"job {job_id} not found")
        return item
