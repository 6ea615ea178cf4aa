"""What this CPU can do per dtype (fp32, bf16): the best measured GEMM rate over every path
torch offers, and the ISA ceiling beside it. No dtype borrows another's figure.

* Probe (`probe`; `probe_gemm` times the GEMM shapes of a profiled step, gemref/mfu/step_profile.py,
  on the same paths): every path of gemref/mfu/gemm_paths.py accurate in the dtype, on square and
  model-shaped GEMMs, interleaved (round r of every (shape, path) runs before round r+1, so
  a slow phase of the machine hits all paths alike); a path's rate on a shape is its best
  round, in FLOP/s (2*M*K*N per call, wall clock). The peak is the best rate of any path.
  The probe also records the process CPU time / (wall time x threads): under 0.9 means the
  process did not get its cores for the whole probe (`contended`).
* Ceiling (`isa_ceiling`): FLOP/cycle per core x clock x cores used, where, in fp32,
  FLOP/cycle = 2 (multiply-add) x fp32 lanes per FMA x FMA pipes. Lanes come from the CPU
  flags (avx512f: 16, avx2+fma: 8), capped by the core's datapath width; pipes and datapath
  come from `_core_spec` (an assumption per vendor/family, stated in the output). In bf16:
  AMX-BF16 (amx_bf16) does 1,024 FLOP/cycle/core (one TDPBF16PS is 16x16x32 multiply-adds,
  one per 16 cycles per core); else AVX512-BF16 (avx512_bf16) `vdpbf16ps` does 2 bf16 products
  per fp32 lane, 2 x 2 x lanes x pipes; else bf16 is converted and runs on the fp32 FMAs. The
  clock is MEASURED (`measure_clock_hz`): a loop of dependent 64-bit register adds (1 cycle
  latency on the x86-64 cores we know of) timed against this thread's CPU time (so time the
  thread was descheduled does not count); /proc/cpuinfo "cpu MHz"
  is only a fallback (under a hypervisor it shows the nominal TSC rate, not the core clock).
  The clock is taken on one thread; an all-core clock can be lower, so the ceiling is an
  upper bound.
"""
from __future__ import annotations

import ctypes
import mmap
import platform
import time
from dataclasses import asdict, dataclass, field

import torch

from ..env import CpuInfo, proc_cpuinfo
from .gemm_paths import BATCHED_PATH, DTYPES, check_path, prepare, probe_paths

# (M, K, N): two squares, then Linear shapes of the presets: "base" (d_model 512) x -> qkv
# (512 -> 1536) and FFN down (2048 -> 512), "small" (d_model 64) x -> qkv and FFN down.
PROBE_SHAPES = ((512, 512, 512), (1024, 1024, 1024), (1024, 512, 1536), (512, 2048, 512),
                (2048, 64, 192), (2048, 128, 64))
# bf16 adds a larger square and the small preset's widest Linear (4096 rows, 128 -> 640): an
# AMX tile GEMM needs more work per call than an fp32 one to reach its rate
SHAPES = {"fp32": PROBE_SHAPES, "bf16": PROBE_SHAPES + ((2048, 2048, 2048), (4096, 128, 640))}
ROUNDS = 3
CONTENDED_BELOW = 0.9      # process CPU time / (wall x threads) of an honest probe


# --- the clock ------------------------------------------------------------------------
_ADDS = 16   # dependent `add rax, rdx` per loop iteration: 16 cycles per iteration


def _dependent_add_loop() -> ctypes.CFUNCTYPE | None:
    """x86-64 machine code for `uint64 f(uint64 n)`: n iterations of 16 dependent adds;
    returns 16 n (n >= 1: n = 0 would count down through 2^64). None where it cannot run
    (not x86-64, or executable memory refused)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not hasattr(mmap, "PROT_EXEC"):
        return None
    body = bytes.fromhex("4801d0") * _ADDS + bytes.fromhex("48ffcf")     # add rax,rdx ... ; dec rdi
    jump_back = (256 - (len(body) + 2)) & 0xFF                              # jnz to the loop start
    code = bytes.fromhex("31c0" "ba01000000") + body + bytes([0x75, jump_back, 0xC3])  # xor eax; mov edx,1
    try:
        buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError):
        return None
    buf.write(code)
    fn = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
    fn._keep = buf              # the code page lives as long as the function
    return fn if fn(3) == 3 * _ADDS else None


def measure_clock_hz(iterations: int = 5_000_000, repeats: int = 5) -> tuple[float | None, str]:
    """(core clock in Hz, method). Best of `repeats`: cycles / this thread's CPU seconds."""
    if iterations < 1 or repeats < 1:
        raise ValueError(f"need iterations >= 1 and repeats >= 1, got {iterations}, {repeats}")
    loop = _dependent_add_loop()
    if loop is not None:
        best = 0.0
        for _ in range(repeats):
            t0 = time.thread_time()
            loop(iterations)
            dt = time.thread_time() - t0
            best = max(best, _ADDS * iterations / dt) if dt > 0 else best
        if best > 0:
            return best, "measured: timed loop of dependent integer adds (1 cycle each)"
    mhz = proc_cpuinfo().get("cpu MHz")
    if mhz:
        return float(mhz) * 1e6, "/proc/cpuinfo cpu MHz (nominal under a hypervisor; not measured)"
    return None, "unknown (no x86-64 add loop, no /proc/cpuinfo MHz)"


# --- the ISA ceiling -------------------------------------------------------------------
@dataclass(frozen=True)
class CoreSpec:
    datapath_bits: int     # width of one FMA pipe
    fma_pipes: int
    label: str


def _core_spec(cpu: CpuInfo) -> CoreSpec:
    """FMA pipes and datapath width per vendor/family (assumptions, see the labels)."""
    if cpu.vendor == "AuthenticAMD":
        if cpu.family == 0x17:
            return (CoreSpec(128, 2, "AMD Zen/Zen+ (family 17h, models < 30h): 2 x 128-bit FMA") if cpu.model < 0x30
                    else CoreSpec(256, 2, "AMD Zen 2 (family 17h): 2 x 256-bit FMA"))
        if cpu.family == 0x19:
            return CoreSpec(256, 2, "AMD Zen 3/Zen 4 (family 19h): 2 x 256-bit FMA; Zen 4 runs a 512-bit "
                                    "FMA as two 256-bit halves")
        if cpu.family == 0x1A:
            return (CoreSpec(256, 2, "AMD Zen 5 mobile (family 1Ah, models 20h-2Fh): 2 x 256-bit FMA")
                    if 0x20 <= cpu.model <= 0x2F else
                    CoreSpec(512, 2, "AMD Zen 5 (family 1Ah: EPYC 9005, Ryzen 9000): 2 x 512-bit FMA"))
    if cpu.vendor == "GenuineIntel" and cpu.family == 6:
        if "avx512f" in cpu.flags:
            return CoreSpec(512, 2, "Intel with AVX-512: 2 x 512-bit FMA (Xeon Scalable Gold 6xxx/Platinum; "
                                    "SKUs with one 512-bit FMA unit reach half)")
        return CoreSpec(256, 2, "Intel (Haswell and later): 2 x 256-bit FMA")
    return CoreSpec(512, 2, f"no table row for {cpu.vendor} family {cpu.family}: assumed 2 FMA pipes "
                            "at the flags' width")


def isa_ceiling(cpu: CpuInfo, threads: int, clock_hz: float | None, clock_method: str, dtype: str = "fp32") -> dict:
    """The `dtype` ceiling in FLOP/s (None where the ISA or clock is unknown), with its terms
    (`formula` says them in words)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; CPU ceilings exist for: {', '.join(DTYPES)}")
    flags = set(cpu.flags)
    isa_bits = 512 if "avx512f" in flags else 256 if {"avx2", "fma"} <= flags else 0
    spec = _core_spec(cpu)
    lanes = min(isa_bits, spec.datapath_bits) // 32
    cores = max(1, min(threads, cpu.cores))
    fma = {512: "avx512f", 256: "avx2+fma"}.get(isa_bits, "no FMA ISA known to gemref")
    label = spec.label
    if dtype == "bf16" and "amx_bf16" in flags:
        per_cycle, isa = 1024, "amx_bf16"
        formula = "AMX-BF16: one TDPBF16PS (16x16x32 multiply-adds) per 16 cycles"
        label = "Intel AMX: one tile matrix-multiply unit per core (Sapphire Rapids and later)"
    elif dtype == "bf16" and "avx512_bf16" in flags and lanes:
        per_cycle, isa = 2 * 2 * lanes * spec.fma_pipes, "avx512_bf16"
        formula = f"AVX512-BF16 vdpbf16ps: 2 x 2 bf16 products x {lanes} fp32 lanes x {spec.fma_pipes} pipes"
    else:
        per_cycle, isa = 2 * lanes * spec.fma_pipes, fma
        formula = f"2 x {lanes} fp32 lanes ({fma}) x {spec.fma_pipes} FMA pipes"
        if dtype == "bf16":
            isa, formula = f"{fma} (no bf16 unit)", formula + ": bf16 converted to fp32, no bf16 unit"
    flops = per_cycle * clock_hz * cores if (per_cycle and clock_hz) else None
    return {"flops": flops, "dtype": dtype, "flop_per_cycle_per_core": per_cycle, "isa": isa, "formula": formula,
            "fp32_lanes": lanes, "fma_pipes": spec.fma_pipes, "core_assumption": label, "clock_hz": clock_hz,
            "clock_method": clock_method, "cores": cores}


# --- the probe -------------------------------------------------------------------------
@dataclass
class ProbeResult:
    flops: float                    # best FLOP/s of any path on any shape
    path: str                       # the path that set it
    shape: tuple[int, int, int]     # (M, K, N) where it did
    rates: dict[str, dict[str, float]]   # path -> "MxKxN" -> best FLOP/s
    excluded: dict[str, str]        # path -> why it was not probed
    cpu_share: float                # process CPU time / (wall x threads) over the probe
    threads: int
    seconds: float
    ceiling: dict = field(default_factory=dict)
    dtype: str = "fp32"

    @property
    def contended(self) -> bool:
        return self.cpu_share < CONTENDED_BELOW

    def best_rate(self, path: str) -> float | None:
        return max(self.rates[path].values()) if self.rates.get(path) else None

    def to_dict(self) -> dict:
        return asdict(self) | {"contended": self.contended}


def _time_call(fn, flops: int, min_seconds: float = 0.005) -> float:
    """FLOP/s of one sample: enough back-to-back calls to last >= min_seconds."""
    calls, elapsed = 0, 0.0
    t0 = time.perf_counter()
    while elapsed < min_seconds or calls == 0:
        fn()
        calls += 1
        elapsed = time.perf_counter() - t0
    return calls * flops / elapsed


def usable_paths(paths, dtype: str) -> tuple[list[str], dict[str, str]]:
    """([the paths that compute the GEMM to `dtype`'s accuracy here], {path: why not} of the others)."""
    usable, excluded = [], {}
    for p in paths:
        ok, why = check_path(p, dtype)
        (usable.append(p) if ok else excluded.__setitem__(p, why))
    return usable, excluded


def probe(shapes=None, paths=None, rounds: int = ROUNDS, dtype: str = "fp32") -> ProbeResult:
    """Measure every usable `dtype` path on every shape (see the module docstring); shapes and
    paths default to the dtype's own (SHAPES, gemm_paths.probe_paths)."""
    shapes = SHAPES[dtype] if shapes is None else shapes
    paths = probe_paths(dtype) if paths is None else paths
    threads = torch.get_num_threads()
    usable, excluded = usable_paths(paths, dtype)
    g = torch.Generator().manual_seed(0)
    calls = {}
    for m, k, n in shapes:
        x, w = torch.randn(m, k, generator=g).to(DTYPES[dtype]), torch.randn(n, k, generator=g).to(DTYPES[dtype])
        for p in usable:
            calls[p, (m, k, n)] = prepare(p, x, w)
            calls[p, (m, k, n)]()                       # warm-up (oneDNN primitive creation)
    rates: dict[str, dict[str, float]] = {p: {} for p in usable}
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        for (p, (m, k, n)), fn in calls.items():
            key = f"{m}x{k}x{n}"
            rates[p][key] = max(rates[p].get(key, 0.0), _time_call(fn, 2 * m * k * n))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    best = max(((r, p, key) for p in usable for key, r in rates[p].items()), default=(0.0, "none", "0x0x0"))
    return ProbeResult(flops=best[0], path=best[1], shape=tuple(int(v) for v in best[2].split("x")),
                       rates=rates, excluded=excluded, cpu_share=cpu / (wall * threads), threads=threads,
                       seconds=wall, dtype=dtype)


def probe_gemm(b: int, m: int, k: int, n: int, reps: int, dtype: str = "fp32") -> dict:
    """Best FLOP/s of each `dtype` GEMM path on one GEMM shape of a step, (batch, M, K, N): the
    fastest of `reps` single calls after one warm-up call, on every path of gemm_paths.py that
    computes the GEMM to `dtype`'s accuracy here (`probe_paths(dtype)`), or a batched shape
    (b > 1) on its one path (BATCHED_PATH). A path that fails on the shape is left out.
    {"best_path", "best_flops_per_s", "rates": {path: FLOP/s}}."""
    g = torch.Generator().manual_seed(0)
    paths = [BATCHED_PATH] if b > 1 else usable_paths(probe_paths(dtype), dtype)[0]
    lead = (b,) if b > 1 else ()
    x, w = (torch.randn(*lead, *shape, generator=g).to(DTYPES[dtype]) for shape in ((m, k), (n, k)))
    flops = 2 * b * m * k * n
    rates = {}
    for p in paths:
        try:
            fn = prepare(p, x, w)
            fn()
        except RuntimeError:      # a path this build lists but cannot run for this shape
            continue
        rates[p] = max(_time_call(fn, flops, min_seconds=0.0) for _ in range(reps))
    best = max(rates, key=rates.get)
    return {"best_path": best, "best_flops_per_s": rates[best], "rates": rates}
