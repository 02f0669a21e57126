"""A seed that has already lost: the band of the reference runs' evaluations (issue 24)."""

from __future__ import annotations

import pytest

from mlrepro.scoring import eval_band

REFERENCE = [
    [[1000, 2.0], [2000, 1.5], [3000, 1.2], [4000, 1.0]],
    [[1000, 2.2], [2000, 1.6], [3000, 1.3], [4000, 1.05], [5000, 0.95]],
    [[1000, 2.1], [2000, 1.55], [3000, 1.25]],
]


def test_band_is_min_to_max_of_the_runs_that_reach_the_point():
    lo, hi = eval_band.band_at(1500, REFERENCE, margin=0)
    assert (lo, hi) == pytest.approx((1.75, 1.9))
    assert eval_band.band_at(4500, REFERENCE, margin=0) is None  # only one run reaches 4500
    lo, hi = eval_band.band_at(1000, REFERENCE, margin=0.1)
    assert (lo, hi) == pytest.approx((1.8, 2.42))


def test_a_curve_inside_or_better_has_not_lost():
    inside = eval_band.check([[1000, 2.1], [2000, 1.55], [3000, 1.25]], REFERENCE)
    assert not inside.lost and inside.checked == 3 and inside.worse == 0
    better = eval_band.check([[1000, 1.5], [2000, 1.0], [3000, 0.8]], REFERENCE)
    assert not better.lost and better.better == 3


def test_patience_consecutive_worse_points_lose_and_name_the_first():
    curve = [[1000, 2.1], [2000, 1.9], [3000, 1.8], [4000, 1.7]]
    result = eval_band.check(curve, REFERENCE, patience=2)
    assert result.lost and result.first_at == 2000 and result.value == 1.9
    assert result.upper == pytest.approx(1.6 * 1.02)
    assert "since 2000 samples: 1.9 not in" in result.message()
    blip = eval_band.check([[1000, 2.1], [2000, 1.9], [3000, 1.25], [4000, 1.02]], REFERENCE, patience=2)
    assert not blip.lost and blip.worse == 1


def test_higher_is_better_metrics_lose_below_the_band():
    acc = [[[1, 0.5], [2, 0.7]], [[1, 0.55], [2, 0.72]]]
    assert eval_band.check([[1, 0.3], [2, 0.4]], acc, lower_is_better=False).lost
    assert not eval_band.check([[1, 0.9], [2, 0.95]], acc, lower_is_better=False).lost


def test_no_overlap_is_not_judged_and_bad_patience_is_refused():
    assert eval_band.check([[99999, 9.0]], REFERENCE).checked == 0
    with pytest.raises(ValueError, match="patience"):
        eval_band.check([], REFERENCE, patience=0)


def test_reference_curves_come_from_counted_runs():
    runs = [{"counted": True, "evals": [[10, 1.0]]}, {"counted": False, "evals": [[10, 5.0]]},
            {"counted": True, "evals": []}]
    assert eval_band.reference_curves(runs) == [[[10, 1.0]]]
