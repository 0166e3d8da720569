"""segadv.experiment.stats: the tests segadv-experiment compares rows with, against published figures."""

import pytest

from segadv.experiment.stats import WelchTest, paired_test, welch_test

# Wikipedia, "Welch's t-test", example 1: Welch t -2.46, df 25.0, p 0.021.
A1 = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
A2 = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]


def test_welch_matches_the_published_example():
    result = welch_test(A1, A2)
    assert result.diff == pytest.approx(sum(A1) / 15 - sum(A2) / 15)
    assert (round(result.t, 2), round(result.df, 1), round(result.p, 3)) == (-2.46, 25.0, 0.021)


def test_paired_t_is_the_one_sample_t_of_the_differences():
    """t = mean(d) / (sd(d) / sqrt(n)) with df n - 1; for d = (1, 2, 3, 4): t = 2.5 / (1.291 / 2) = 3.873,
    two-sided p 0.0305 (t table, df 3)."""
    result = paired_test({0: 2.0, 1: 4.0, 2: 6.0, 3: 8.0}, {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0})
    assert result.seeds == [0, 1, 2, 3] and result.diff == 2.5 and result.df == 3
    assert result.t == pytest.approx(3.873, abs=1e-3) and result.p == pytest.approx(0.0305, abs=1e-4)


def test_undefined_tests_are_none_not_nan():
    assert paired_test({0: 0.5, 1: 0.6}, {1: 0.4, 2: 0.3}) is None  # one common seed
    same = paired_test({0: 0.5, 1: 0.6}, {0: 0.4, 1: 0.5})
    assert same.diff == pytest.approx(0.1) and (same.t, same.p) == (None, None)
    assert welch_test([0.5, 0.5], [0.4, 0.4]) == WelchTest(diff=pytest.approx(0.1), t=None, df=None, p=None)
    assert welch_test([0.5], [0.4, 0.3]).p is None
