"""The cost-aware draft length (`DraftPolicy`, `policy.py`): each step, how long a draft each row
verifies, from this machine's measured costs (`costs.py`) and each request's estimated acceptance
(`estimates.py`). The engine asks it about rows (`RowPlan`) and tells it what a step did once
(`StepReport`, `report.py`)."""

from specdraft.policy.costs import CostModel
from specdraft.policy.estimates import Acceptance
from specdraft.policy.policy import EXPLORE_EVERY, DraftPolicy
from specdraft.policy.report import CallTiming, DraftingTiming, RowPlan, StepReport, Verified, VerifyTiming

__all__ = ["Acceptance", "CallTiming", "CostModel", "DraftPolicy", "DraftingTiming", "EXPLORE_EVERY", "RowPlan",
           "StepReport", "Verified", "VerifyTiming"]
