"""A broker's session as the status table shows it, in one cell."""

from __future__ import annotations

import time


def test_status_shows_a_session_in_one_cell() -> None:
    from cli.cluster import session_text

    assert session_text(None) == "" and session_text({"state": "lazy", "since": 1.0}) == "lazy"
    assert session_text({"state": "ready", "since": 1.0, "startup_s": 12.34}) == "ready 12.3s"
    assert session_text({"state": "starting", "since": time.time() - 4.2}) == "starting 4s"
    assert session_text({"state": "failed", "since": 1.0, "error": "no java"}) == "failed"
