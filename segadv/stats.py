"""Two-sample tests for comparing runs over seeds (``tools/experiment.py``'s tables), through
``scipy.stats``: Welch's t (unequal variances) between two rows, and the paired t over the seeds
both rows ran. Each returns plain numbers, with ``None`` where the test is undefined (fewer than
two values, no spread) rather than scipy's NaN and warning.
"""

from __future__ import annotations

import statistics
from typing import Any, Optional


def welch_test(a: list[float], b: list[float]) -> dict[str, Optional[float]]:
    """mean(a) - mean(b), Welch's t, its Welch-Satterthwaite df and two-sided p. t, df and p are
    None with fewer than two values on a side, or when both sides have no spread."""
    diff = statistics.fmean(a) - statistics.fmean(b) if a and b else None
    if len(a) < 2 or len(b) < 2 or statistics.variance(a) + statistics.variance(b) == 0.0:
        return {"diff": diff, "t": None, "df": None, "p": None}
    from scipy import stats

    result = stats.ttest_ind(a, b, equal_var=False)
    return {"diff": diff, "t": float(result.statistic), "df": float(result.df), "p": float(result.pvalue)}


def paired_test(a: dict[int, float], b: dict[int, float]) -> Optional[dict[str, Any]]:
    """The per-seed differences a[s] - b[s] over the seeds both have: their mean, the paired t
    (df = n - 1) and its two-sided p. None with fewer than two common seeds; t and p None when
    every difference is the same."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    diffs = [a[s] - b[s] for s in seeds]
    mean = statistics.fmean(diffs)
    if statistics.stdev(diffs) == 0.0:
        return {"seeds": seeds, "diff": mean, "t": None, "df": len(seeds) - 1, "p": None}
    from scipy import stats

    result = stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds])
    return {"seeds": seeds, "diff": mean, "t": float(result.statistic), "df": len(seeds) - 1, "p": float(result.pvalue)}
