"""A job's two restart budgets (SkyPilot's split, PR 4169).

* infrastructure recoveries: node faults fixed by a reboot or by moving the job (default 3);
* application-error restarts: the job's own failures (default 0: it fails, as before).

A fault's :class:`~gpu_recovery.domain.fault_vocabulary.Budget` says which one it spends;
a flapping node's repeat is not charged again (``escalation.charges_job``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpu_recovery.domain.fault_vocabulary import Budget

DEFAULT_MAX_INFRA_RECOVERIES = 3
DEFAULT_MAX_APP_RESTARTS = 0
MAX_BUDGET = 20

# Attribute names on the job item.
FIELD_MAX_INFRA = "max_infra_recoveries"
FIELD_INFRA_USED = "infra_recoveries_used"
FIELD_MAX_APP = "max_app_restarts"
FIELD_APP_USED = "app_restarts_used"


def validate_limits(max_infra_recoveries: Any, max_app_restarts: Any) -> list[str]:
    """Problems with budget limits from a JobSpec or the settings, each saying what to fix."""
    errors = []
    for name, value in ((FIELD_MAX_INFRA, max_infra_recoveries), (FIELD_MAX_APP, max_app_restarts)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_BUDGET:
            errors.append(f"{name} must be an integer 0..{MAX_BUDGET}, got {value!r}")
    return errors


@dataclass(frozen=True)
class JobBudgets:
    max_infra_recoveries: int = DEFAULT_MAX_INFRA_RECOVERIES
    infra_recoveries_used: int = 0
    max_app_restarts: int = DEFAULT_MAX_APP_RESTARTS
    app_restarts_used: int = 0

    def __post_init__(self) -> None:
        errors = validate_limits(self.max_infra_recoveries, self.max_app_restarts)
        if self.infra_recoveries_used < 0 or self.app_restarts_used < 0:
            errors.append("used counts cannot be negative")
        if errors:
            raise ValueError("job budgets: " + "; ".join(errors))

    def remaining(self, budget: Budget) -> int:
        if budget is Budget.INFRASTRUCTURE:
            return max(0, self.max_infra_recoveries - self.infra_recoveries_used)
        if budget is Budget.APPLICATION:
            return max(0, self.max_app_restarts - self.app_restarts_used)
        return 0

    def spend(self, budget: Budget) -> JobBudgets:
        """One more restart charged to ``budget`` (ValueError when none is left)."""
        if budget is Budget.NONE:
            return self
        if self.remaining(budget) <= 0:
            raise ValueError(f"no {budget.value} budget left: {self.describe()}")
        if budget is Budget.INFRASTRUCTURE:
            return replace(self, infra_recoveries_used=self.infra_recoveries_used + 1)
        return replace(self, app_restarts_used=self.app_restarts_used + 1)

    def describe(self) -> str:
        return (f"infrastructure recoveries {self.infra_recoveries_used} of {self.max_infra_recoveries} "
                f"used, application-error restarts {self.app_restarts_used} of {self.max_app_restarts} used")

    def to_fields(self) -> dict[str, int]:
        return {FIELD_MAX_INFRA: self.max_infra_recoveries, FIELD_INFRA_USED: self.infra_recoveries_used,
                FIELD_MAX_APP: self.max_app_restarts, FIELD_APP_USED: self.app_restarts_used}



@dataclass(frozen=True)
class BudgetOutcome:
    restart: bool  # the job may restart for this fault
    budgets: JobBudgets  # after charging
    charged: Budget  # NONE when nothing was spent
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"restart": self.restart, "charged": self.charged.value, "reason": self.reason,
                **self.budgets.to_fields()}


def settle(budgets: JobBudgets, budget: Budget, *, charge: bool = True) -> BudgetOutcome:
    """May the job restart for a fault that spends ``budget``? ``charge=False``: the node's
    repeat of an infrastructure fault already charged to this job (flapping) restarts it for
    free. Application errors are the job's own and always charged."""
    if budget is Budget.NONE:
        return BudgetOutcome(True, budgets, Budget.NONE, "this fault spends no budget")
    if not charge and budget is Budget.INFRASTRUCTURE:
        return BudgetOutcome(True, budgets, Budget.NONE,
                             f"the node's repeat of a fault already charged to this job: not charged "
                             f"again ({budgets.describe()})")
    if budgets.remaining(budget) <= 0:
        return BudgetOutcome(False, budgets, Budget.NONE,
                             f"no {budget.value} budget left ({budgets.describe()})")
    spent = budgets.spend(budget)
    return BudgetOutcome(True, spent, budget, f"{budget.value} budget charged ({spent.describe()})")
