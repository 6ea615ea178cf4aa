"""Arguments every command shares, each checked when the command line is parsed (before any
work starts), with errors in the user's terms.

- `--device auto|cpu|cuda` (default auto: cuda when available), resolved by `device_of`.
- `--dataset DIR` (a folder that exists; its manifest is checked when the command runs).
- Counts and fractions: `int_at_least(n)`, `fraction` (0, 1], `share` [0, 1], `positive_float`.
- Output paths: `output_file` (--json) and `output_dir` (--out, --checkpoint-dir): the path
  must not be a directory (resp. a file), and the folder it goes into (or its nearest existing
  ancestor, for folders still to be created) must accept a new file, tried by creating and
  removing one. `check_output_file`/`check_output_dir` are the same checks as functions.
- `check_local_ranks`: spawned ranks against the machine (see RANKS_PER_CPU); `check_workers`: the
  same bound for DataLoader worker processes.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Callable

from .errors import UsageError, user_input

DEVICES = ("auto", "cpu", "cuda")
# Spawned CPU ranks are processes of one thread each; beyond a few per core they only
# time-share (and each holds a model copy), so more than RANKS_PER_CPU x cores is refused
# unless GEMREF_MAX_RANKS=N says how many this machine may run. On CUDA: one rank per GPU.
RANKS_PER_CPU = 4
MAX_RANKS_ENV = "GEMREF_MAX_RANKS"


def argtype(check: Callable[[str], object], name: str) -> Callable[[str], object]:
    """An argparse `type=` from a checker raising UsageError (argparse shows its message)."""
    def parse(text: str):
        try:
            return check(text)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = name
    return parse


def _number(kind: type, text: str, what: str, ok: Callable[[float], bool]):
    try:
        value = kind(text)
    except ValueError:
        raise UsageError(f"expected {what}, got {text!r}") from None
    if value != value or not ok(value):         # value != value: NaN
        raise UsageError(f"expected {what}, got {text!r}")
    return value


def int_at_least(low: int) -> Callable[[str], int]:
    return argtype(lambda t: _number(int, t, f"an integer >= {low}", lambda v: v >= low), f"int>={low}")


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)
positive_float = argtype(lambda t: _number(float, t, "a number > 0", lambda v: 0 < v < float("inf")), "float>0")
fraction = argtype(lambda t: _number(float, t, "a fraction in (0, 1]", lambda v: 0 < v <= 1), "fraction")
share = argtype(lambda t: _number(float, t, "a share in [0, 1]", lambda v: 0 <= v <= 1), "share")


# ----------------------------------------------------------------------------- output paths


def _writable_folder(path: Path, shown: str) -> None:
    """The folder `path` will be created in (its nearest existing ancestor) accepts a new file."""
    folder = path.absolute()
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"{shown}: {folder} is a file, so nothing can be created under it")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".gemref-write-check-")
    except OSError as e:
        raise UsageError(f"{shown}: {folder} is not writable (creating a file there failed: {e.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: str, flag: str = "") -> str:
    """A file gemref may write (atomically, next to it): not a directory, its folder writable."""
    shown = f"{flag} {path}".strip()
    if not path.strip():
        raise UsageError(f"{flag or 'output file'}: empty path; give a file path")
    if Path(path).is_dir():
        raise UsageError(f"{shown}: is a directory; give a file path")
    _writable_folder(Path(path).parent, shown)
    return path


def check_output_dir(path: str, flag: str = "") -> str:
    """A folder gemref may create and write into: not a file, writable."""
    shown = f"{flag} {path}".strip()
    if Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"{shown}: is a file, not a folder")
    _writable_folder(Path(path), shown)
    return path


output_file = argtype(check_output_file, "output file")
output_dir = argtype(check_output_dir, "output folder")


def _data_dir(path: str) -> str:
    if Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"{path}: is a file, not a folder")
    return path


data_dir = argtype(_data_dir, "data folder")


def _dataset_folder(path: str) -> str:
    if not Path(path).is_dir():
        raise UsageError(f"{path}: " + ("is a file, not a dataset folder" if Path(path).exists() else
                                        "no such dataset folder"))
    return path


dataset_folder = argtype(_dataset_folder, "dataset folder")
DATASET_HELP = ("train on this dataset folder (Parquet shards + manifest.json with its dataset section, data/README.md; "
                "e.g. from `gemref data movielens`): checked, never regenerated nor written; the preset gives the "
                "architecture, the manifest the vocab sizes, feature counts and max_len")


def add_dataset_arg(p: argparse.ArgumentParser) -> None:
    """--dataset DIR (a folder that exists; gemref/data/folder.py checks its manifest when the command runs)."""
    p.add_argument("--dataset", metavar="DIR", type=dataset_folder, default=None, help=DATASET_HELP)


# ----------------------------------------------------------------------------- device, ranks


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=DEVICES, help="auto (default: cuda when available), cpu, cuda")


def device_of(name: str):
    """--device -> torch.device; 'cuda' where there is none is the user's mistake."""
    import torch

    from .env import resolve_device

    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here (torch.cuda.is_available() is False)")
    with user_input():
        return resolve_device(name)


def max_local_ranks(device_type: str) -> tuple[int, str]:
    """(the most ranks this machine may spawn on `device_type`, why that many)."""
    if device_type == "cuda":
        import torch

        n = torch.cuda.device_count()
        return n, f"one rank per GPU and this host has {n}; use torchrun across hosts for more"
    from .env import env_count

    limit = env_count(MAX_RANKS_ENV)
    if limit is not None:
        return limit, f"{MAX_RANKS_ENV}={limit}"
    cores = os.cpu_count() or 1
    return RANKS_PER_CPU * cores, (f"{RANKS_PER_CPU} one-thread ranks per CPU core x {cores} cores; "
                                   f"set {MAX_RANKS_ENV}=N to allow N")


def check_local_ranks(ranks: int, device_type: str, flag: str = "--ranks") -> None:
    """UsageError if `ranks` local processes are more than this machine may run."""
    limit, why = max_local_ranks(device_type)
    if ranks > limit:
        raise UsageError(f"{flag} {ranks}: at most {limit} local {device_type} ranks here ({why})")


def check_workers(workers: int, flag: str = "--num-workers") -> None:
    """UsageError if `workers` DataLoader processes are more than RANKS_PER_CPU x cores (each is a process)."""
    limit = RANKS_PER_CPU * (os.cpu_count() or 1)
    if workers > limit:
        raise UsageError(f"{flag} {workers}: at most {limit} DataLoader worker processes here "
                         f"({RANKS_PER_CPU} per CPU core x {os.cpu_count() or 1} cores)")


def split_pairs(pairs: list[str] | None, flag: str) -> dict[str, str]:
    """["k=v", ...] -> {k: "v"} (the values stay text: each is parsed by its field's type)."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} expects key=value, got {pair!r}")
        if key.strip() in out:
            raise UsageError(f"{flag} {key.strip()} given twice")
        out[key.strip()] = value
    return out


def peak_tflops(text: str) -> str:
    """--peak-tflops: "bf16=989,fp32=67" checked as GEMREF_PEAK_TFLOPS is (gemref/env.py parse_peaks)."""
    from .env import PEAKS_VALID, parse_peaks   # imports torch: only when the flag is given

    if parse_peaks(text) is None:
        raise argparse.ArgumentTypeError(f"{text!r}; valid: {PEAKS_VALID}")
    return text
