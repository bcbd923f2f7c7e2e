"""fastkda's validation suite: judges any FlashKDA-signature KDA forward against float64 ground truth.

    from fastkda.validation import quick_check, run_suite
    r = quick_check(fastkda.fwd, seq_lens=[8192], H=96, device="cuda")     # one benchmark-like case
    report = run_suite("fastkda", tiers="all")                              # every tier
    print(report.table()); assert report.passed

Command line: ``python -m fastkda.validation --impl fastkda --tier all``.

Modules: :mod:`.cases` (inputs per tier), :mod:`.metrics` (errors and thresholds, with their reasons),
:mod:`.suite` (runner, results, table, implementations registry).
"""

from .cases import TIERS, Case, KDAInputs, tier_cases
from .metrics import Thresholds, relative_l2, token_error
from .suite import (IMPLEMENTATIONS, CaseResult, SuiteReport, compute_truth, format_table, quick_check,
                    resolve_impl, run_case, run_suite)

__all__ = [
    "quick_check", "run_suite", "run_case", "compute_truth", "resolve_impl", "format_table",
    "CaseResult", "SuiteReport", "Case", "KDAInputs", "Thresholds", "TIERS", "IMPLEMENTATIONS",
    "tier_cases", "relative_l2", "token_error",
]
