"""The figures read from a status's metrics (untrusted: what is not a valid number is dropped), their rate text
and the load share's."""

from __future__ import annotations

import math

from controller.protocol.tasks.pipeline_metrics import figures, load_text, rate_text, sparkline


# ---- a pipeline's figures ------------------------------------------------------------------------------
def test_figures_keep_valid_numbers_and_drop_the_rest() -> None:
    f = figures(
        {
            "rows": 1200,
            "batches": True,  # a boolean is not a count
            "input_rows_per_s": 148.25,
            "processed_rows_per_s": -3,
            "backlog_files": 2**60,
            "rate_history": [1, "2", None, math.inf, 3.5, -1, *range(30)],
        }
    )
    assert (f.rows, f.batches, f.input_rows_per_s, f.processed_rows_per_s, f.backlog_files) == (
        1200,
        None,
        148.25,
        None,
        None,
    )
    assert f.rate_history == tuple(float(v) for v in range(10, 30))  # the last 20 entries, all valid here
    assert figures(None) == figures("<script>") == figures({})  # type: ignore[arg-type]


def test_rate_text_and_its_sparkline() -> None:
    assert sparkline((0.0, 5.0, 10.0)) == "▁▅█"
    assert sparkline((0.0, 0.0)) == "▁▁" and sparkline(()) == ""
    assert rate_text(figures({"input_rows_per_s": 150.4, "rate_history": [75, 150]})) == "150/s ▅█"
    assert rate_text(figures({"input_rows_per_s": 2.25})) == "2.2/s"
    assert rate_text(figures({"rows": 3})) == ""


def test_a_task_status_load_share_is_bounded() -> None:
    assert figures({"load_share": 0.4, "driver_rss_mb": 700, "batch_ms": 2000}).load_share == 0.4
    assert figures({"load_share": 1e9}).load_share is None  # absurd: no figure, not a huge one
    assert figures({"load_share": "high"}).load_share is None
    assert figures({"driver_rss_mb": -1}).driver_rss_mb is None
    assert load_text(figures({"load_share": 1.3})) == "1.30 behind"
    assert load_text(figures({"load_share": 0.25})) == "0.25"
    assert load_text(figures({})) == ""
