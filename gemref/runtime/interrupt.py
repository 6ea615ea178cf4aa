"""Stopping cleanly: SIGINT/SIGTERM as an exception, and children that never outlive their parent.

  * `signals_raise()` (the `gemref` command, gemref/cli.py): SIGINT or SIGTERM raises
    `Interrupted` in the main thread, once; later ones are ignored while `finally` blocks clean
    up (children killed, temporary files removed, locks released). The command then prints one
    line and exits 128 + the signal's number (130, 143).
  * A child gemref starts (a spawned rank, gemref/parallel/launch.py) calls `own_group()`
    first: it leads its own process group (a Ctrl-C at the terminal reaches the parent only)
    and is killed when its parent dies, however it dies. Children started inside
    `starting_children()` ignore SIGINT from their first instruction.
  * `kill_group(pid)` kills a child and everything in its process group (a rank's data
    workers; a notebook kernel and what it started, gemref/walkthrough/batch.py, which finds
    its kernel with `children()`).

Torch-free and Linux-first (prctl); elsewhere a child is still killed explicitly by its parent.
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
PR_SET_PDEATHSIG = 1


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: the command stops, cleans up and exits 128 + signum."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name}"


@contextmanager
def signals_raise() -> Iterator[None]:
    """Inside the block, the first SIGINT/SIGTERM raises Interrupted; later ones are ignored.
    Outside the main thread (signals cannot be caught there) the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)      # cleaning up: a second Ctrl-C must not cut it short
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def starting_children() -> Iterator[None]:
    """Start children inside this block: they start with SIGINT ignored (an ignored disposition
    survives exec; multiprocessing's spawned children do not keep a blocked mask), so a Ctrl-C
    at the terminal while they import prints no traceback of theirs. A SIGTERM that arrives
    meanwhile is held and raised as the block ends, so the caller's cleanup sees every child
    started. Held by a Python handler, not only by this thread's signal mask: a process-directed
    signal goes to any thread that does not block it (torch's, OpenMP's), and Python then runs
    the handler in the main thread at once, which raised mid-start, with a child half-started
    and none of them known to the caller (they outlived the command)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    old = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),   # a blocked signal stays pending even so
           signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, frame: held.append(signum))}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        if held:
            signal.raise_signal(held[0])       # to the restored handler, as if it came now


def own_group(parent: int | None = None) -> None:
    """In a child, first: lead a new process group, die with the parent (Linux), ignore SIGINT
    (the parent decides) and die on SIGTERM. `parent`: the pid that started this child
    (default: os.getppid()); if it is gone already, exit now."""
    parent = os.getppid() if parent is None else parent
    try:
        os.setpgid(0, 0)
    except OSError:            # already a group or session leader
        pass
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if os.getppid() != parent:                       # the parent died before prctl took effect
        os._exit(128 + signal.SIGKILL)


def children() -> set[int]:
    """The pids whose parent is this process (Linux: from /proc; elsewhere none)."""
    me, found = os.getpid(), set()
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        found.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return found


def kill_group(pid: int) -> None:
    """SIGKILL `pid` and, when it leads one, its process group (gone already: nothing to do)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
