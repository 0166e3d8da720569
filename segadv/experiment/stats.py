"""Two-sample tests for comparing runs over seeds (``segadv-experiment``'s tables), through
``scipy.stats``: Welch's t (unequal variances) between two rows, and the paired t over the seeds
both rows ran. Each gives plain numbers, with ``None`` where the test is undefined (fewer than
two values, no spread) rather than scipy's NaN and warning.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class WelchTest:
    diff: Optional[float]  # mean(a) - mean(b); None when a side is empty
    t: Optional[float]
    df: Optional[float]  # Welch-Satterthwaite
    p: Optional[float]  # two-sided


@dataclass(frozen=True)
class PairedTest:
    seeds: list[int]  # the seeds both sides have
    diff: float  # the mean per-seed difference
    t: Optional[float]
    df: int  # len(seeds) - 1
    p: Optional[float]  # two-sided


def welch_test(a: list[float], b: list[float]) -> WelchTest:
    """mean(a) - mean(b), Welch's t, its Welch-Satterthwaite df and two-sided p. t, df and p are
    None with fewer than two values on a side, or when both sides have no spread."""
    diff = statistics.fmean(a) - statistics.fmean(b) if a and b else None
    if len(a) < 2 or len(b) < 2 or statistics.variance(a) + statistics.variance(b) == 0.0:
        return WelchTest(diff, None, None, None)
    from scipy import stats

    result = stats.ttest_ind(a, b, equal_var=False)
    return WelchTest(diff, float(result.statistic), float(result.df), float(result.pvalue))


def paired_test(a: dict[int, float], b: dict[int, float]) -> Optional[PairedTest]:
    """The per-seed differences a[s] - b[s] over the seeds both have: their mean, the paired t
    (df = n - 1) and its two-sided p. None with fewer than two common seeds; t and p None when
    every difference is the same."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    diffs = [a[s] - b[s] for s in seeds]
    mean = statistics.fmean(diffs)
    if statistics.stdev(diffs) == 0.0:
        return PairedTest(seeds, mean, None, len(seeds) - 1, None)
    from scipy import stats

    result = stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds])
    return PairedTest(seeds, mean, float(result.statistic), len(seeds) - 1, float(result.pvalue))
