"""Where and with what a run happens: the device, the CPU, the versions and git sha a record names.

Cross-cutting helpers used by train, the benches and the waterfall (nothing here imports
another gemref module except the package version and gemref.errors).

Every environment variable gemref reads is checked where it is read, by one helper per kind
(`env_choice`, `env_count`, `env_folder`, `env_threads`); `check_environment` runs them all
before a run starts (`resolve_device`). A value set but empty, negative, non-numeric or not a
usable folder is a UsageError naming the variable and its valid values: unset it for the
default. OMP_NUM_THREADS set but empty is refused too (libgomp calls it invalid, then uses
every core: a silent fallback); a comma list ("4,1", OpenMP's nesting levels) is allowed.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from . import __version__
from .errors import UsageError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# Environment variables that change what a run computes or how fast: every record names them.
KNOBS = ("GEMREF_GDPA", "GEMREF_CPU_GEMM", "GEMREF_PEAK_TFLOPS", "OMP_NUM_THREADS", "TRITON_INTERPRET")


def _refuse(name: str, value: str, valid: str) -> UsageError:
    return UsageError(f"{name}={value!r}; valid: {valid} (or unset it for the default)")


def env_choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """$name as one of `choices` (case and surrounding blanks ignored); `default` when unset."""
    value = os.environ.get(name)
    if value is None:
        return default
    if value.strip().lower() not in choices:
        raise _refuse(name, value, ", ".join(choices))
    return value.strip().lower()


def _positive(text: str) -> bool:
    text = text.strip()
    return text.isascii() and text.isdecimal() and int(text) >= 1


def env_count(name: str) -> int | None:
    """$name as an integer >= 1; None when unset."""
    value = os.environ.get(name)
    if value is not None and not _positive(value):
        raise _refuse(name, value, "an integer >= 1")
    return None if value is None else int(value)


def env_threads(name: str = "OMP_NUM_THREADS") -> str | None:
    """$name as OpenMP reads it: integers >= 1, comma-separated per nesting level; None when unset."""
    value = os.environ.get(name)
    if value is not None and not all(_positive(p) for p in value.split(",")):
        raise _refuse(name, value, "an integer >= 1, or a comma list of them (OpenMP nesting levels)")
    return value


def env_folder(name: str) -> Path | None:
    """$name as a folder path (absolute, or relative to the current folder; it need not exist
    yet); None when unset. Refused: empty, blanks around it, control characters, a leading
    '~' (the shell did not expand it) and an existing file."""
    value = os.environ.get(name)
    if value is None:
        return None
    valid = "a folder path, absolute or relative, without a leading '~' (write $HOME)"
    if not value or value != value.strip() or not value.isprintable() or value.startswith("~"):
        raise _refuse(name, value, valid)
    if Path(value).exists() and not Path(value).is_dir():
        raise UsageError(f"{name}={value}: is a file, not a folder; valid: {valid}")
    return Path(value)


PEAK_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8")


PEAKS_VALID = f"dtype=TFLOPS pairs joined by commas, e.g. bf16=989,fp32=67 (dtypes: {', '.join(PEAK_DTYPES)})"


def parse_peaks(text: str) -> dict[str, float] | None:
    """"bf16=989,fp32=67" -> {dtype: TFLOP/s}; None when malformed (an unknown dtype, a number
    that is not finite and > 0, a dtype given twice)."""
    out: dict[str, float] = {}
    for item in text.split(","):
        dtype, _, number = (part.strip() for part in item.partition("="))
        try:
            tflops = float(number)
        except ValueError:
            return None
        if dtype not in PEAK_DTYPES or not 0 < tflops < float("inf") or dtype in out:
            return None
        out[dtype] = tflops
    return out


def env_peaks(name: str = "GEMREF_PEAK_TFLOPS") -> dict[str, float]:
    """$name as {dtype: dense peak TFLOP/s of ONE device} (`parse_peaks`); {} when unset. The user's
    own figure for a device the datasheet table lacks (or to override it), labelled as given by the
    user wherever it is used."""
    value = os.environ.get(name)
    if value is None:
        return {}
    peaks = parse_peaks(value)
    if peaks is None:
        raise _refuse(name, value, PEAKS_VALID)
    return peaks


# Every variable gemref reads, with its check (GEMREF_GDPA: attention/triton/variant.py, read
# on the Triton path and checked by train/compose.setup).
CPU_GEMM_MODES = ("auto", "blas", "onednn")       # GEMREF_CPU_GEMM (precision/fast_linear.py)
CHECKS = {"GEMREF_CPU_GEMM": lambda name: env_choice(name, CPU_GEMM_MODES, "auto"),
          "GEMREF_MAX_RANKS": env_count, "GEMREF_CACHE_DIR": env_folder, "GEMREF_DATA_DIR": env_folder,
          "GEMREF_PEAK_TFLOPS": env_peaks, "OMP_NUM_THREADS": env_threads}


def check_environment() -> None:
    """UsageError for the first variable of CHECKS set to a value gemref cannot use."""
    for name, check in CHECKS.items():
        check(name)


def cache_root() -> Path:
    """$GEMREF_CACHE_DIR, else $XDG_CACHE_HOME/gemref, else ~/.cache/gemref (not created here)."""
    return env_folder("GEMREF_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or
                                                  Path.home() / ".cache") / "gemref"


def resolve_device(name: str = "auto") -> torch.device:
    """auto -> cuda when available, else cpu; an unavailable or unknown device is a ValueError.
    The environment is checked first (`check_environment`): every run resolves its device."""
    check_environment()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {name!r}; valid: auto, cpu, cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch.cuda.is_available() is False")
    return torch.device(name)


def knobs() -> dict[str, str | None]:
    """{knob: its value here, None when unset} for every KNOBS entry (checked: `check_environment`)."""
    check_environment()
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


# The packages whose builds pair with one torch (requirements-gpu.txt says where each pairing is from).
FBGEMM_FOR_TORCH = {"2.10": "1.5", "2.11": "1.6", "2.12": "1.7", "2.13": "1.8"}   # torchrec has fbgemm's number
TORCHAO_MIN_TORCH = {"0.18": "2.11"}


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def paired_versions(installed=_installed, requires=None, cuda: bool | None = None) -> list[str]:
    """What in this environment does not pair with its torch (empty: all paired): Triton other than
    the one torch's wheel requires; fbgemm-gpu/torchrec of another torch's release, or fbgemm's CPU
    build beside a CUDA torch; a torchao older than torch's. `installed`, `requires` and `cuda` are
    the lookups (package -> version or None, torch's Requires-Dist, torch.version.cuda set), for tests."""
    torch_version = installed("torch") or torch.__version__
    requires = (importlib.metadata.requires("torch") or []) if requires is None else requires
    cuda = torch.version.cuda is not None if cuda is None else cuda
    problems = []
    wanted = [r.split(";")[0].split("==")[1].strip() for r in requires if r.replace(" ", "").startswith("triton==")]
    triton = installed("triton")
    if wanted and triton and triton != wanted[0]:
        problems.append(f"triton {triton} is installed, torch {torch_version} was built with triton {wanted[0]}")
    pair = FBGEMM_FOR_TORCH.get(_minor(torch_version))
    for name in ("fbgemm-gpu", "fbgemm-gpu-cpu", "torchrec"):
        version = installed(name)
        if version and pair and _minor(version) != pair:
            problems.append(f"{name} {version} pairs with another torch: torch {_minor(torch_version)} takes {pair}.x")
    if cuda and installed("fbgemm-gpu-cpu"):
        problems.append("fbgemm-gpu-cpu (CPU kernels only) is installed beside a CUDA torch: install fbgemm-gpu")
    ao = installed("torchao")
    need = TORCHAO_MIN_TORCH.get(_minor(ao)) if ao else None
    if need and tuple(map(int, _minor(torch_version).split("."))) < tuple(map(int, need.split("."))):
        problems.append(f"torchao {ao} needs torch >= {need}, torch is {torch_version}")
    return problems


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
