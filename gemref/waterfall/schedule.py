"""When each rung's timed windows run, which rungs are alive together, and what counts as contended.

Interleaving. Round k runs window k of every rung of a group, in ladder order, before any
rung's window k+1:

    round 0: rung 0 w0, rung 1 w0, ..., rung n w0;   round 1: rung 0 w1, ...;   ...

so a slow phase of the machine (another job, a thermal dip) lands on every rung of a round
alike, and rung i's window k ran right next to rung i-1's window k: the paired ratio of
gemref/waterfall/stats.py compares windows that saw the same machine.

Groups. The rungs of a group are alive at once (model, optimizer, data iterator each). When
the training state of every rung fits in ALIVE_SHARE of the free memory (the rest is left
for activations), there is one group: every rung. Otherwise the closest honest schedule is
sliding pairs, (0, 1), (1, 2), ...: two rungs alive at a time, interleaved, so every
`vs_previous` is still a paired ratio of side-by-side windows; a rung's row comes from the
pair with its previous rung, and `vs_baseline` is then the product of the pairs' medians
(no longer paired with rung 0 itself).

Contention. Each window records, per rank, the process CPU time and wall time and the main
thread's CPU time and run-queue delay (Linux schedstat: the time it was ready to run but
had no core). A rank's core share in a window is thread CPU / (thread CPU + run-queue
delay): the fraction of a core it got while it wanted one, blind to the time it waited for
a peer at a collective (asleep, not queued). Without schedstat it falls back to process
CPU / wall (then waiting at a collective also lowers it), and on CUDA without schedstat it
is not measured. A window in which any rank got under CONTENDED_BELOW of a core is
contended. A round with a contended window runs again as a whole (pairs stay side by side
in time), at most `max_retries` times over the run; the last attempt of each round is kept,
less its contended windows, and the row says how many windows it kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..mfu.timing import StepRecord, compute_seconds, interleaved

CONTENDED_BELOW = 0.9    # share of one core a rank must get in a window
ALIVE_SHARE = 0.5        # share of free memory the alive rungs' training state may take


@dataclass
class Window:
    """One rank's measurement of one timed window: its training steps (gemref/mfu/timing.py) and
    the main thread's run-queue wait over the window."""

    rung: int                    # index in the list of rungs that run
    round: int
    attempt: int
    steps: list[StepRecord]
    run_delay_s: float | None    # the main thread's run-queue wait; None without schedstat
    device_type: str = "cpu"
    threads: int = 1             # torch threads of the rank
    world: int = 1
    compute_s: float | None = None   # GPU ranks: the window's compute from a profiled step (rows.group_rounds)

    @classmethod
    def from_dict(cls, d: dict) -> "Window":
        return cls(**{**d, "steps": [StepRecord(**s) for s in d["steps"]]})

    @property
    def wall_s(self) -> float:
        return sum(s.wall_s for s in self.steps)

    @property
    def data_s(self) -> float:
        return sum(s.data_s for s in self.steps)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.steps)

    @property
    def model_flops(self) -> int:
        return sum(s.model_flops for s in self.steps)

    @property
    def thread_cpu_s(self) -> float:
        return sum(s.cpu_s for s in self.steps)

    @property
    def cpu_per_wall(self) -> float:
        wall = self.wall_s
        return sum(s.process_cpu_s for s in self.steps) / wall if wall > 0 else 0.0

    def compute(self) -> float | None:
        """This rank's compute seconds in the window (gemref/mfu/timing.py compute_seconds)."""
        if self.compute_s is not None:
            return self.compute_s
        parts = [compute_seconds(s, self.world, self.device_type, self.threads) for s in self.steps]
        return None if any(p is None for p in parts) else sum(parts)

    @property
    def core_share(self) -> float | None:
        """Share of a core the rank got while it wanted one (see the module doc); None: not measured."""
        if self.run_delay_s is not None:
            busy = self.thread_cpu_s + self.run_delay_s
            return self.thread_cpu_s / busy if busy > 0 else 1.0
        return None if self.device_type == "cuda" else self.cpu_per_wall

    @property
    def contended(self) -> bool:
        share = self.core_share
        return share is not None and share < CONTENDED_BELOW


@dataclass
class Round:
    """One attempt at round `index` of a group: windows[rank][position in the group]."""

    group: int
    index: int
    attempt: int
    windows: list[list[Window]]
    kept: bool = False           # the last attempt of its round (its uncontended windows count)


def groups(state_bytes: list[int], free_bytes: float) -> list[list[int]]:
    """The rungs alive together: one group of all when their training state fits in
    ALIVE_SHARE of `free_bytes`, else sliding pairs (0, 1), (1, 2), ... (see the module doc)."""
    n = len(state_bytes)
    if n == 0:
        raise ValueError("no rung to run")
    if n <= 2 or sum(state_bytes) <= ALIVE_SHARE * free_bytes:
        return [list(range(n))]
    return [[i, i + 1] for i in range(n - 1)]


def run_rounds(members: list[int], windows: int, run_window: Callable[[int, int, int], Window],
               everyone: Callable[[list[Window]], list[list[Window]]], retries: list[int],
               group: int = 0) -> list[Round]:
    """Run `windows` rounds over the rungs `members`, interleaved (gemref/mfu/timing.py
    `interleaved`, the module doc's order).

    run_window(rung, round, attempt) measures one window of a rung on this rank;
    everyone(mine) returns every rank's windows of the round (the same on every rank, so
    every rank takes the same retry decision); retries is a one-element budget shared by
    all groups of the run, spent here.
    """
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows}")
    out: list[Round] = []
    attempt = [0]

    def redo(k: int, tried: int, results: dict) -> bool:
        out.append(Round(group, k, tried, everyone([results[str(i)] for i in members])))
        again = any(w.contended for rank in out[-1].windows for w in rank) and retries[0] > 0
        if again:
            retries[0] -= 1
        else:
            out[-1].kept = True
        attempt[0] = tried + 1 if again else 0
        return again

    interleaved({str(i): (lambda k, i=i: run_window(i, k, attempt[0])) for i in members}, windows, redo=redo)
    return out
