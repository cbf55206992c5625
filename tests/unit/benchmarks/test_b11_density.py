"""B11's judgement, without Spark: a point keeps up on its 90th-percentile batch, the knee is the largest size
that kept up, and the table has a cell under every heading."""

from __future__ import annotations

from benchmarks.b11_density import HEADERS, _behind_for_good, _p90, knee, rows_of
from benchmarks.common import table


def test_a_lone_slow_batch_is_not_falling_behind() -> None:
    assert _p90([100] * 19 + [9000]) == 100
    assert _p90([6000] * 10) == 6000
    assert _p90([]) is None


def test_the_knee_is_the_largest_size_that_kept_up() -> None:
    points = [{"pipelines": 1, "kept_up": True}, {"pipelines": 2, "kept_up": True}, {"pipelines": 4, "kept_up": False}]
    assert knee(points) == 2
    assert knee([{"pipelines": 1, "kept_up": False}]) == 0
    assert knee([]) == 0


def test_every_heading_has_its_cell() -> None:
    point = {
        "isolation": "shared",
        "pipelines": 2,
        "kept_up": True,
        "p90_batch_ms": 1877,
        "worst_batch_ms": 1877,
        "median_batch_ms": 900,
        "rss_per_pipeline_mb": 310.9,
        "cpu_s_per_batch": 0.31,
        "cores_used": 0.5,
        "load_average": 1.2,
    }
    rows = rows_of([point])
    assert len(rows[0]) == len(HEADERS)
    assert "1,877" in table(HEADERS, rows)


def test_a_point_ends_early_only_once_its_90th_percentile_cannot_come_under_the_trigger() -> None:
    """300 s of a 5 s trigger is at most 61 batches: 6 slow ones may still be the tenth over, 7 cannot."""
    assert not _behind_for_good([9000] * 6 + [100] * 10, 300.0)
    assert _behind_for_good([9000] * 7, 300.0)
    assert not _behind_for_good([4999] * 50, 300.0)  # under the trigger, however close
