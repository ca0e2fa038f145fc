"""The command line's progress bar: one status line on stderr.

    with Progress(total, "fastloader pack shards", unit="images") as bar:
        for ...:
            bar.update(1, nbytes=len(data))

The line shows items done/total, the percentage, MB/s (when bytes are
counted) and the ETA, and ends with the elapsed time.  `show` decides
whether it is drawn: True draws it only when the stream is a terminal (a
redirected stderr -- a log file, a CI job, a test's capture -- stays
silent), "always" draws it anyway, False never.  On a terminal the line is
redrawn in place with a carriage return, at most every 0.2 s; forced onto
something else it is written as whole lines, at most one every 10 s, so a
log does not fill with redraws.

No dependency on the compiled extension (fastloader.tools.sample uses it too).
"""
from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """A progress line for `total` items (see the module docstring).

    Args:
        total: items expected (0 or None: unknown; no percentage or ETA).
        desc: what is shown before the counts.
        unit: the items' name ("images", "files").
        show: True (only on a terminal), "always", or False.
        stream: where to write (default: sys.stderr at construction time).
    Not thread-safe: update it from one thread.
    """

    TTY_INTERVAL = 0.2    # seconds between redraws on a terminal
    LOG_INTERVAL = 10.0   # seconds between lines elsewhere (show="always")

    def __init__(self, total, desc: str, *, unit: str = "items", show=True, stream=None):
        if show not in (True, False, "always"):
            raise ValueError(f"show must be True, False or 'always', not {show!r}")
        self.total = int(total or 0)
        self.desc = desc
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream)
        self.enabled = show == "always" or (show is True and self.tty)
        self.done = 0
        self.nbytes = 0
        self._t0 = time.monotonic()
        self._last = None   # time of the last draw
        self._width = 0     # length of the line drawn last (tty), to blank its tail
        self._closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def update(self, n: int = 1, nbytes: int = 0) -> None:
        """Count `n` more items and `nbytes` more bytes; redraw if due."""
        self.done += n
        self.nbytes += nbytes
        if not self.enabled:
            return
        now = time.monotonic()
        interval = self.TTY_INTERVAL if self.tty else self.LOG_INTERVAL
        if self._last is None or now - self._last >= interval:
            self._draw(now, final=False)

    def close(self) -> None:
        """Draw the final line (with the elapsed time) and end it; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.enabled:
            self._draw(time.monotonic(), final=True)

    def line(self, now: float | None = None, final: bool = False) -> str:
        """The status text (without carriage return or newline)."""
        elapsed = max((time.monotonic() if now is None else now) - self._t0, 1e-9)
        parts = [f"{self.desc}: {self.done}/{self.total} {self.unit}" if self.total
                 else f"{self.desc}: {self.done} {self.unit}"]
        if self.total:
            parts.append(f"{100.0 * self.done / self.total:3.0f}%")
        if self.nbytes:
            parts.append(f"{self.nbytes / 1e6 / elapsed:.1f} MB/s")
        if final:
            parts.append(f"in {_clock(elapsed)}")
        elif self.total and self.done:
            parts.append(f"ETA {_clock((self.total - self.done) * elapsed / self.done)}")
        return "  ".join(parts)

    def _draw(self, now: float, final: bool) -> None:
        self._last = now
        text = self.line(now, final)
        if self.tty:
            pad = max(self._width - len(text), 0)
            self._width = len(text)
            out = "\r" + text + " " * pad + ("\n" if final else "")
        else:
            out = text + "\n"
        try:
            self.stream.write(out)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not fail the work
            self.enabled = False


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False
