"""fastloader.tools.progress.Progress: the command line's progress line."""
from __future__ import annotations

import io
import re

import pytest

from fastloader.tools.progress import Progress


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_silent_when_not_a_terminal_unless_forced():
    s = io.StringIO()
    with Progress(4, "job", show=True, stream=s) as bar:
        bar.update(4, nbytes=100)
    assert s.getvalue() == ""
    with Progress(4, "job", show=False, stream=_Tty()) as bar:
        bar.update(4)
    assert bar.stream.getvalue() == ""


def test_forced_onto_a_file_writes_whole_lines():
    s = io.StringIO()
    with Progress(4, "job", unit="images", show="always", stream=s) as bar:
        bar.update(1, nbytes=2_000_000)
        bar.update(2, nbytes=1_000_000)  # within LOG_INTERVAL of the first line: not drawn
    lines = s.getvalue().splitlines()
    assert "\r" not in s.getvalue() and len(lines) == 2, lines
    assert re.fullmatch(r"job: 1/4 images\s+25%\s+[\d.]+ MB/s\s+ETA \d:\d\d:\d\d", lines[0]), lines[0]
    assert re.fullmatch(r"job: 3/4 images\s+75%\s+[\d.]+ MB/s\s+in \d:\d\d:\d\d", lines[1]), lines[1]


def test_terminal_redraws_in_place_and_ends_the_line(monkeypatch):
    t = [100.0]
    monkeypatch.setattr("fastloader.tools.progress.time.monotonic", lambda: t[0])
    s = _Tty()
    bar = Progress(10, "job", stream=s)
    for _ in range(10):
        t[0] += 1.0  # 1 s per item: every update redraws, ETA counts down
        bar.update(1)
    bar.close()
    bar.close()  # idempotent
    out = s.getvalue()
    assert out.count("\r") == 11 and out.endswith("\n") and out.count("\n") == 1
    assert "job: 5/10 items   50%  ETA 0:00:05" in out and "MB/s" not in out  # no bytes counted
    assert out.rstrip().endswith("job: 10/10 items  100%  in 0:00:10")


def test_unknown_total_and_bad_show():
    assert Progress(None, "scan", unit="files", show=False).line() == "scan: 0 files"
    with pytest.raises(ValueError, match="show"):
        Progress(1, "x", show="yes")
