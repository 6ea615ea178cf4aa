"""Where and with what a run happens: the device, the CPU, the versions and git sha a record names.

Cross-cutting helpers used by train, the benches and the waterfall (nothing here imports
another gemref module except the package version).
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from . import __version__

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Environment variables that change what a run computes or how fast: every record names them.
KNOBS = ("GEMREF_GDPA", "GEMREF_CPU_GEMM", "OMP_NUM_THREADS", "TRITON_INTERPRET")


def resolve_device(name: str = "auto") -> torch.device:
    """auto -> cuda when available, else cpu; an unavailable or unknown device is a ValueError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {name!r}; valid: auto, cpu, cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch.cuda.is_available() is False")
    return torch.device(name)


def knobs() -> dict[str, str | None]:
    """{knob: its value here, None when unset} for every KNOBS entry."""
    return {name: os.environ.get(name) for name in KNOBS}


def versions() -> dict:
    """torch and gemref versions and the git sha of the checkout (None outside a git clone)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=5)
        sha = out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        sha = None
    return {"torch": torch.__version__, "gemref": __version__, "git_sha": sha}


@dataclass(frozen=True)
class CpuInfo:
    vendor: str
    family: int
    model: int
    stepping: int
    model_name: str
    flags: tuple[str, ...]
    cores: int             # physical cores this process may run on

    @property
    def flags_hash(self) -> str:
        return hashlib.sha256(" ".join(sorted(self.flags)).encode()).hexdigest()[:12]


def proc_cpuinfo() -> dict[str, str]:
    """/proc/cpuinfo's fields of the first logical CPU ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():      # the first logical CPU
        if ":" in line:
            key, value = line.split(":", 1)
            out[key.strip()] = value.strip()
    return out


def _int(text: str | None) -> int:
    try:
        return int(text or "")
    except ValueError:
        return -1              # absent or not a number (e.g. "stepping: unknown", ARM's fields)


@functools.lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """This CPU as /proc/cpuinfo's first logical CPU describes it (read once per process)."""
    f = proc_cpuinfo()
    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    siblings, per_socket = max(1, _int(f.get("siblings"))), max(1, _int(f.get("cpu cores")))
    smt = max(1, siblings // per_socket)
    return CpuInfo(vendor=f.get("vendor_id", platform.machine()), family=_int(f.get("cpu family")),
                   model=_int(f.get("model")), stepping=_int(f.get("stepping")),
                   model_name=f.get("model name", platform.processor() or platform.machine()),
                   flags=tuple((f.get("flags") or f.get("Features") or "").split()),
                   cores=max(1, logical // smt))
