"""One writer per folder: `folder_lock(folder, flag)` around everything a command writes there.

Two gemref processes writing one folder (a checkpoint folder, a dataset folder, a waterfall's
or the notebooks' --out) would interleave their files. The second one is refused with a
UsageError (exit 2) naming the folder and the holder's pid. The lock is `fcntl.flock` on
LOCK_NAME in the folder: the kernel drops it when its holder exits or is killed, so a stale
lock file never blocks anyone. Generated datasets' own lock (gemref/data/shards.py
`ensure_dataset`, which waits instead) takes the same file, so `gemref data generate` and a
run generating its data exclude each other too.
"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import UsageError

LOCK_NAME = ".lock"
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _other_torchrun_rank() -> bool:
    """A torchrun rank other than 0 (rank 0 holds the job's locks)."""
    return all(v in os.environ for v in TORCHRUN_VARS) and os.environ["RANK"].strip() != "0"


def holder(lock_file: Path) -> int | None:
    """The pid holding a flock on `lock_file` (Linux: /proc/locks), else the pid it wrote there."""
    try:
        st = os.stat(lock_file)
        inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if "FLOCK" in fields and inode in fields and "->" not in fields:   # "->": a waiter
                    return int(fields[fields.index(inode) - 1])
    except (OSError, ValueError):
        pass
    try:
        return int(lock_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def folder_lock(folder: str | os.PathLike, flag: str = "") -> Iterator[Path]:
    """Hold `folder`'s lock (creating the folder) for the block, or raise UsageError when another
    process holds it. `flag`: how the user named the folder (e.g. "--checkpoint-dir"). On a
    torchrun rank other than 0 it locks nothing: the job's rank 0 holds the lock."""
    folder = Path(folder)
    if _other_torchrun_rank():
        yield folder
        return
    shown = f"{flag} {folder}".strip()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UsageError(f"{shown}: cannot create it or write in it ({e.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = holder(folder / LOCK_NAME)
            raise UsageError(f"{shown}: in use by another gemref process ({f'pid {pid}' if pid else 'pid unknown'}) "
                             "writing there; wait for it to finish or choose another folder") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield folder
    finally:
        os.close(fd)      # releases the lock
