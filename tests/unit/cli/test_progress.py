"""Progress of long operations, pure: the terminal line and the log line (no terminal needed)."""

from __future__ import annotations

import io

import pytest

from cli.progress import Progress, render_plain, render_tty


@pytest.mark.parametrize("width", [20, 40, 80, 200])
@pytest.mark.parametrize("done,total", [(0, 8), (3, 8), (8, 8), (0, 0), (9, 8)])
def test_the_terminal_line_fits_and_shows_the_count(width, done, total):
    line = render_tty("waiting for broker-2 to hand over its tasks", done, total, 4.12, 60, width, "moved")
    assert len(line) <= width
    assert "\r" not in line and "\n" not in line
    if width >= 60:
        assert f"{done}/{total} moved" in line and "4.1s/60s" in line
    bar = line[line.index("[") + 1 : line.index("]")] if "[" in line else ""
    if bar:
        expected = 24 if total <= 0 or done >= total else round(done / total * 24)
        assert bar.count("#") == expected and len(bar) == 24


def test_a_long_subject_is_shortened_not_the_count():
    line = render_tty("x" * 200, 2, 5, 1.0, None, 60, "groups")
    assert line.endswith("2/5 groups  1.0s") and "…" in line and len(line) <= 60


def test_the_log_line_is_plain():
    assert (
        render_plain("waiting for t1 to run on b2", 0, 1, 0.25, 30, "moved")
        == "[   0.2s] waiting for t1 to run on b2: 0/1 moved (timeout 30s)"
    )
    assert render_plain("deleting", 1, 1, 12.0, None) == "[  12.0s] deleting: 1/1"


def test_plain_lines_only_when_the_count_changes_and_none_in_json_mode():
    out = io.StringIO()
    p = Progress("w", timeout=10, stream=out, tty=False, quiet_s=3600)
    for done in (0, 0, 0, 1, 1, 2):
        p(done, 2)
    p.close()
    lines = out.getvalue().splitlines()
    assert [line.split(": ")[1].split(" ")[0] for line in lines] == ["0/2", "1/2", "2/2"]
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    silent = io.StringIO()
    q = Progress("w", stream=silent, tty=True, enabled=False)
    q(1, 2)
    q.close()
    assert silent.getvalue() == ""


def test_a_terminal_line_is_redrawn_in_place_and_ended_once():
    out = io.StringIO()
    with Progress("w", stream=out, tty=True, width=40) as p:
        p(0, 3)
        p(1, 3)
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
