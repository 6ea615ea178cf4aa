"""Building cpu_fused's C++ kernels: compiled once per machine, cached, loaded with ctypes.

The kernels are two C++ files (kernel.cpp: computes in the storage dtype or float32; amx.cpp:
bf16 products on AMX tiles) sharing common.h, with a C interface and no PyTorch headers, so
they compile into one library in under a minute with the system compiler (`$CXX`, else `c++`, else `g++`:
the same compiler torch.compile's CPU backend needs) and loads with ctypes; the tensors are
passed as raw pointers. It is compiled with -march=native, so the library is specific to the
CPU: the cache key holds the source, the flags, the compiler's version and the CPU's model
and feature flags, and the cache folder is `$GEMREF_CACHE_DIR/cpu_fused` (default
~/.cache/gemref/cpu_fused). Concurrent processes (pytest workers, ranks) take a file lock,
so one compiles and the others load its result; a library is written to a temporary name
and renamed, so a killed build never leaves a half-written one.

Loading a library runs its code, so a library is loaded only from a folder that is this
user's alone (files.private_path: else a UsageError) and only if its sha256 is the one
recorded beside it (`<library>.sha256`, written atomically) by the build that made it: a
missing or different digest (a library planted, truncated, or built before digests were
recorded) is logged and the library rebuilt, never loaded.

`library()` returns the loaded library, or the reason it cannot (no compiler, a failed
build): the kernel reports that reason as unavailable and `kernel="auto"` falls back.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

from ...env import cache_root, cpu_info
from ...runtime.files import atomic_write_text, private_path

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("kernel.cpp", "amx.cpp"))
HEADERS = (Path(__file__).with_name("common.h"),)
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno", "-Wno-psabi")
BUILD_TIMEOUT_S = 600

# the library's C entry point per tensor dtype (name of the dtype in torch): kernel.cpp's
ENTRY_POINTS = {"float32": "gemref_gdpa_f32", "float64": "gemref_gdpa_f64", "bfloat16": "gemref_gdpa_bf16"}
# amx.cpp's (bf16): on the AMX unit, and the same kernel on software tiles (any CPU)
AMX_ENTRY_POINTS = {"hardware": "gemref_gdpa_bf16_amx", "emulated": "gemref_gdpa_bf16_amx_emulated"}

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | str] = {}


def cache_dir() -> Path:
    return cache_root() / "cpu_fused"


def compiler() -> str | None:
    """The C++ compiler to use: $CXX, else c++ or g++ on the PATH (None: none found)."""
    for name in (os.environ.get("CXX"), "c++", "g++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _key(cxx: str) -> str:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    h = hashlib.sha256()
    cpu = cpu_info()   # -march=native: the library belongs to this CPU model and its features
    identity = f"{cpu.vendor} {cpu.family}/{cpu.model} {cpu.model_name} {' '.join(cpu.flags)}"
    sources = [path.read_bytes() for path in SOURCES + HEADERS]
    for part in (*sources, " ".join(FLAGS).encode(), version.encode(), identity.encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:20]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def unverified(target: Path) -> str | None:
    """Why the library `target` must not be loaded (None: its sha256 is the one its build recorded)."""
    if not target.exists():
        return "not built yet"
    private_path(target.parent, target.name)
    try:
        recorded = private_path(target.parent, target.name + ".sha256").read_text().strip()
    except FileNotFoundError:
        return "no sha256 recorded for it"
    return None if _sha256(target) == recorded else "its sha256 is not the one recorded when it was built"


def _build(cxx: str, target: Path) -> str | None:
    """Compiles SOURCES into target (atomically), recording its sha256 first; the error's last line, or None."""
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        why = unverified(target)           # another process may have built it while this one waited
        if why is None:
            return None
        if why != "not built yet":
            log.warning("cpu_fused: rebuilding %s: %s", target, why)
        log.info("compiling the cpu_fused attention kernels (once per machine, ~45 s): %s", target)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        try:
            proc = subprocess.run([cxx, *FLAGS, *map(str, SOURCES), "-o", str(tmp)], capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            tmp.unlink(missing_ok=True)
            return f"{cxx} did not finish in {BUILD_TIMEOUT_S} s"
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            return f"{cxx} failed (exit {proc.returncode}): {lines[-1] if lines else 'no output'}"
        os.chmod(tmp, 0o755)
        atomic_write_text(target.with_name(target.name + ".sha256"), _sha256(tmp) + "\n", mode=0o644)
        os.replace(tmp, target)
    return None


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    for name in (*ENTRY_POINTS.values(), *AMX_ENTRY_POINTS.values()):
        fn = getattr(lib, name)
        fn.restype = i64
        fn.argtypes = [ctypes.c_int, ctypes.c_int] + [p] * 11 + [i64, i64, i64, ctypes.c_int, i64, ctypes.c_double,
                                                   ctypes.c_double] + [i64] * 4
    return lib


def library() -> ctypes.CDLL | str:
    """The loaded kernel library, or the reason it cannot be built or loaded here."""
    with _lock:
        if "lib" not in _loaded:
            _loaded["lib"] = _load()
            if isinstance(_loaded["lib"], str):
                log.warning("cpu_fused attention kernel unavailable: %s", _loaded["lib"])
        return _loaded["lib"]


def _load() -> ctypes.CDLL | str:
    cxx = compiler()
    if cxx is None:
        return "no C++ compiler found (set $CXX or install g++)"
    target = cache_dir() / f"cpu_fused-{_key(cxx)}.so"
    try:
        private_path(target.parent)
        error = None if unverified(target) is None else _build(cxx, target)
    except OSError as e:
        return f"cannot build into {target.parent}: {e}"
    if error is not None:
        return error
    try:
        return _declare(ctypes.CDLL(str(target)))
    except (OSError, AttributeError) as e:
        return f"cannot load {target}: {e}"
