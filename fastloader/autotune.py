"""The num_workers="auto" controller, a plain object fed with counters.

The engine starts `num_workers` threads (the usable CPUs); the controller
lets only some of them take jobs (the prefetch window stays sized for all of
them, so parking a thread never drains the queue).  It starts with all of
them, so the first batches come as fast as the machine allows; it parks one
while the others have 15% to spare and the consumer has not waited for
three windows -- which frees a core for a training loop that needs the CPU --
and adds one back while the consumer waits for data.

No clock, engine or threads in here: `observe` takes the time, the
consumer's total wait and the workers' busy seconds, so tests can drive it
with made-up counters.
"""
from __future__ import annotations

__all__ = ["AutoTuner"]


class AutoTuner:
    """Decides how many of `max_workers` threads take jobs.

    `active` is the current decision (starts at max_workers); `history` lists
    (seconds since `t0`, workers) at every change.
    """

    WINDOW_S = 0.25        # seconds of counters per decision
    HUNGRY_FRAC = 0.05     # consumer waits more than this: add a worker (after two windows)
    STARVED_FRAC = 0.3     # ... or at once above this
    CALM_FRAC = 0.01       # consumer waits less than this: maybe park one
    CALM_WINDOWS = 3       # calm windows before parking
    SPARE = 0.85           # n - 1 workers must carry the load with 15% to spare

    def __init__(self, max_workers, t0, active=None):
        self.max_workers = max_workers
        self.active = max_workers if active is None else active
        self.t0 = t0
        self.history = [(0.0, self.active)]
        self._snap = None
        self._calm = 0
        self._hungry = 0

    def due(self, now):
        """Whether observe() would decide now (read the counters only then)."""
        return self._snap is None or now - self._snap[0] >= self.WINDOW_S

    def observe(self, now, wait_s, busy_s):
        """Feed the counters: `now` (seconds, any monotonic clock), `wait_s`
        (total seconds the consumer waited so far) and `busy_s` (per-worker
        total busy seconds).  Returns the new number of active workers when
        it changes, else None.  At most one decision per WINDOW_S."""
        snap = self._snap
        if snap is not None and now - snap[0] < self.WINDOW_S:
            return None
        self._snap = (now, wait_s, list(busy_s))
        if snap is None:
            return None
        wall = now - snap[0]
        wait_frac = (wait_s - snap[1]) / wall
        used = sum(b1 - b0 for b1, b0 in zip(busy_s, snap[2])) / wall  # worker-seconds per second
        n = self.active
        if wait_frac > self.HUNGRY_FRAC and n < self.max_workers:
            # two windows in a row, so one late batch does not add a thread
            self._hungry += 1
            self._calm = 0
            if self._hungry >= 2 or wait_frac > self.STARVED_FRAC:
                n += 1
                self._hungry = 0
        elif wait_frac < self.CALM_FRAC and n > 1:
            self._hungry = 0
            self._calm += 1
            if self._calm >= self.CALM_WINDOWS and used < (n - 1) * self.SPARE:
                n -= 1
                self._calm = 0
        else:
            self._calm = 0
            self._hungry = 0
        if n == self.active:
            return None
        return n

    def applied(self, now, n):
        """Record the number of workers the engine actually set."""
        self.active = n
        self.history.append((round(now - self.t0, 3), n))
