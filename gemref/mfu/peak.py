"""Peak FLOP/s of the device an MFU divides by: a datasheet table for GPUs, a measured probe
for CPUs.

* GPU (gemref/mfu/gpu_table.py): exact device names only; an unknown GPU has no peak
  (MFU = None, shown as "N/A"), never another GPU's figure, unless the user gives its peak:
  GEMREF_PEAK_TFLOPS="bf16=989,fp32=67" (dense TFLOP/s of one device per dtype; the CLI's
  --peak-tflops sets it), which takes precedence on any device and is labelled "given by the
  user" in every record and table.
* CPU (gemref/mfu/cpu_probe.py): per dtype (fp32, bf16), the best GEMM rate any torch path
  reaches on this machine in that dtype (BLAS, oneDNN, packed variants, ...), with that dtype's
  ISA ceiling beside it (AVX-512/AVX2 FMA for fp32; AMX-BF16, AVX512-BF16 or the fp32 FMAs for
  bf16). No dtype ever gets another's figure: a dtype not probed on CPUs (fp16, fp8, ...) has
  no peak (None). Cached per CPU and dtype in $GEMREF_CACHE_DIR (default
  ~/.cache/gemref)/cpu_peak.json under a key of vendor, family, model, stepping, a hash of the
  ISA flags, torch threads, torch version, the dtype and the probe's version. A probe during which the process got under 90% of its cores (process
  CPU time / (wall x threads)) is not cached; it is re-measured up to `ATTEMPTS` times, and if
  every attempt was contended the best is used for this process only (labelled so). The
  cache keeps the best uncontended figure ever measured: a later probe never lowers it (a peak
  too low would inflate MFU); `refresh=True` (`gemref peak --refresh`) probes again.
  The cache is trusted only when it is this user's alone (files.private_path), and an entry
  only when it is well formed, for these threads and at most ABOVE x the ISA ceiling
  computed now (with a clock measured now): otherwise it is probed again, with the reason logged.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..runtime.files import private_path, write_json
from ..env import CpuInfo, cache_root, cpu_info, env_peaks

PROBE_VERSION = 3      # bump when the probe's paths or shapes change: old cache entries no longer apply
CPU_DTYPES = ("fp32", "bf16")
ATTEMPTS = 3
FAR_BELOW = 0.5        # footnote when the probe reaches under this share of the ISA ceiling
ABOVE = 1.05           # ... or more than this share (the ceiling's assumptions do not fit)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Peak:
    flops: float | None   # FLOP/s; None when unknown
    source: str           # where the figure comes from
    dtype: str
    method: str = ""      # how it was obtained (datasheet lookup, probe details)


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_info().model_name


def gpu_peak(name: str, dtype: str) -> Peak:
    """Datasheet peak of the GPU called exactly `name` (or a hardware-profile name)."""
    from .gpu_table import gpu_peak_flops   # the datasheet table: loaded only for a GPU's peak
    flops, source = gpu_peak_flops(name, dtype)
    return Peak(flops, source, dtype, "datasheet lookup by exact device name")


# --- the CPU cache ----------------------------------------------------------------------
def cache_path() -> Path:
    """$GEMREF_CACHE_DIR/cpu_peak.json (env.cache_root), once the folder and file are checked as ours."""
    return private_path(cache_root(), "cpu_peak.json")


def key_fields(cpu: CpuInfo | None = None, threads: int | None = None, dtype: str = "fp32") -> dict:
    cpu = cpu or cpu_info()
    return {"vendor": cpu.vendor, "family": cpu.family, "model": cpu.model, "stepping": cpu.stepping,
            "flags_sha256": cpu.flags_hash, "threads": threads or torch.get_num_threads(),
            "torch": torch.__version__, "dtype": dtype, "probe_version": PROBE_VERSION}


def cache_key(fields: dict) -> str:
    return " | ".join(f"{k}={v}" for k, v in fields.items())


def read_cache() -> dict:
    try:
        data = json.loads(cache_path().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def write_cache_entry(key: str, entry: dict) -> None:
    cache = read_cache()
    cache[key] = entry
    write_json(cache_path(), cache, mode=0o600)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def untrusted(entry, fields: dict, ceiling: dict) -> str | None:
    """Why a cached peak record cannot be used here (None: it can)."""
    from .cpu_probe import CONTENDED_BELOW   # the CPU probe: loaded only for a CPU's peak
    if not isinstance(entry, dict):
        return "not a record"
    if not (_number(entry.get("flops")) and entry["flops"] > 0 and _number(entry.get("cpu_share"))
            and isinstance(entry.get("path"), str) and isinstance(entry.get("rates"), dict)
            and all(isinstance(r, dict) for r in entry["rates"].values())
            and isinstance(entry.get("shape"), (list, tuple)) and len(entry["shape"]) == 3
            and all(isinstance(v, int) and v > 0 for v in entry["shape"])):
        return "malformed (flops, cpu_share, path, rates or shape missing or not numbers)"
    if entry.get("dtype", "fp32") != fields["dtype"]:
        return f"a {entry.get('dtype')!r} figure, not {fields['dtype']}"
    if entry.get("threads") != fields["threads"]:
        return f"measured with {entry.get('threads')!r} threads, not {fields['threads']}"
    if entry["cpu_share"] < CONTENDED_BELOW:
        return f"a contended probe ({entry['cpu_share']:.0%} of its cores)"
    if ceiling.get("flops") and entry["flops"] > ABOVE * ceiling["flops"]:
        return (f"{entry['flops'] / 1e9:.1f} GFLOP/s is above the ISA ceiling computed now "
                f"({ceiling['flops'] / 1e9:.1f} GFLOP/s, {ceiling['isa']})")
    return None


# --- the CPU peak -----------------------------------------------------------------------
def _measure(dtype: str) -> dict:
    """A probe record, re-measured while contended, at most ATTEMPTS times."""
    from .cpu_probe import probe   # the CPU probe: loaded only for a CPU's peak
    best = None
    for attempt in range(1, ATTEMPTS + 1):
        result = probe(dtype=dtype)
        if best is None or not result.contended or result.flops > best.flops:
            best = result
        if not result.contended:
            break
    record = best.to_dict()
    record.update(measured_at=time.strftime("%Y-%m-%d %H:%M:%S"), attempts=attempt)
    return record


def footnotes(report: dict) -> list[str]:
    """What a reader must know about this CPU peak (contention, distance from the ceiling)."""
    notes, ceiling = [], report["ceiling"]
    if report["contended"]:
        notes.append(f"the probe got {report['cpu_share']:.0%} of its cores (< 90%) in all {report['attempts']} "
                     "attempts: this figure is low, not cached; rerun `gemref peak --refresh` on a quiet machine")
    if ceiling.get("flops") is None:
        notes.append(f"no ISA ceiling: {ceiling.get('isa')}, clock {ceiling.get('clock_method')}")
        return notes
    share = report["flops"] / ceiling["flops"]
    if share < FAR_BELOW:
        notes.append(f"the probe reached {share:.0%} of the ISA ceiling: no torch GEMM path here comes near this "
                     f"core's FMA rate, or the ceiling's assumption is too high ({ceiling['core_assumption']})")
    elif share > ABOVE:
        notes.append(f"the probe exceeds the ISA ceiling ({share:.0%}): the assumption "
                     f"({ceiling['core_assumption']}) does not fit this CPU (a hypervisor may report another "
                     "CPU model), or the GEMM ran at a higher clock than the add loop")
    return notes


_PROBED: dict[str, dict] = {}   # this process's report per key: every run in a process uses one figure


def check_cpu_dtype(dtype: str) -> str:
    if dtype not in CPU_DTYPES:
        raise ValueError(f"dtype={dtype!r}: CPU peaks are probed for {', '.join(CPU_DTYPES)}")
    return dtype


def cpu_peak_report(refresh: bool = False, dtype: str = "fp32") -> dict:
    """Everything known about this CPU's `dtype` peak: the figure MFU uses, per-path rates, the
    ISA ceiling, where it came from (cache or a probe now) and footnotes."""
    from .cpu_probe import CONTENDED_BELOW, isa_ceiling, measure_clock_hz   # the CPU probe: only for a CPU's peak
    cpu = cpu_info()
    fields = key_fields(cpu, dtype=check_cpu_dtype(dtype))
    key = cache_key(fields)
    if key in _PROBED and not refresh:
        return _PROBED[key]
    cached = read_cache().get(key)
    ceiling = isa_ceiling(cpu, fields["threads"], *measure_clock_hz(), dtype=dtype)
    why = untrusted(cached, fields, ceiling) if cached is not None else "none cached for this CPU, threads and torch"
    if why is not None:
        (log.info if cached is None else log.warning)("CPU peak cache %s: %s; probing", cache_path(), why)
        cached = None
    else:
        cached = dict(cached, ceiling=ceiling)     # the ceiling as computed now, not as stored
    if cached is not None and not refresh:
        record, origin = cached, f"cache {cache_path()} (measured {cached.get('measured_at')})"
    else:
        record = _measure(dtype)
        record["ceiling"] = ceiling
        if untrusted(record, fields, ceiling) is None and (cached is None or record["flops"] > cached["flops"]):
            write_cache_entry(key, record)
        origin = "probe now" + (" (contended: not cached)" if record["contended"] else "")
        if cached is not None and cached["flops"] >= record["flops"]:
            record, origin = cached, f"cache {cache_path()} (higher than the probe now, which is kept out)"
    report = dict(record, key=fields, origin=origin, cpu=cpu.model_name)
    report["contended"] = record["cpu_share"] < CONTENDED_BELOW
    report["notes"] = footnotes(report)
    _PROBED[key] = report
    return report


def cpu_peak(refresh: bool = False, dtype: str = "fp32") -> Peak:
    """This CPU's `dtype` peak (see the module docstring for how it is measured and cached)."""
    r = cpu_peak_report(refresh, dtype)
    ceiling = r["ceiling"].get("flops")
    vs = (f"; {r['ceiling']['isa']} ceiling {ceiling / 1e9:.1f} GFLOP/s ({r['flops'] / ceiling:.0%} of it)"
          if ceiling else "")
    m, k, n = r["shape"]
    source = (f"measured: best {dtype} GEMM {r['flops'] / 1e9:.1f} GFLOP/s via {r['path']} at {m}x{k}x{n}, "
              f"{r['threads']} thread(s), {r['cpu']} (family {r['key']['family']} model {r['key']['model']})"
              f"{vs}" + ("; CONTENDED probe" if r["contended"] else ""))
    method = (f"probe: {len(r['rates'])} {dtype} GEMM paths x {len(next(iter(r['rates'].values()), {}))} "
              f"shapes, best of interleaved rounds; from {r['origin']}")
    return Peak(r["flops"], source, dtype, method)


def versus_fp32(low: dict, fp32: dict) -> list[dict]:
    """Per GEMM shape probed in both reports (cpu_peak_report of a dtype and of fp32): each
    dtype's best rate over its paths (GFLOP/s), the path, and their ratio."""
    def best(report: dict) -> dict[str, tuple[float, str]]:
        out: dict[str, tuple[float, str]] = {}
        for path, rates in report["rates"].items():
            for shape, rate in rates.items():
                if rate > out.get(shape, (0.0, ""))[0]:
                    out[shape] = (rate, path)
        return out
    a, b, dtype = best(low), best(fp32), low["key"]["dtype"]
    return [{"MxKxN": s, f"{dtype}_gflops": a[s][0] / 1e9, f"{dtype}_path": a[s][1], "fp32_gflops": b[s][0] / 1e9,
             "fp32_path": b[s][1], f"{dtype}_over_fp32": a[s][0] / b[s][0]}
            for s in sorted(set(a) & set(b), key=lambda s: [int(v) for v in s.split("x")])]


def peak_flops(device: torch.device | str, dtype: str) -> Peak:
    """The peak FLOP/s an MFU is measured against, with its source.

    dtype: "fp32", "bf16", "fp16", "tf32", "fp8", "mxfp8". GPUs: the datasheet row. CPUs: the
    probe of that dtype (fp32, bf16); any other dtype has no CPU peak (None), never another
    dtype's. Which dtype a run's MFU divides by is gemref/mfu/meter.py `gemm_dtype`'s call.
    """
    device = torch.device(device)
    given = env_peaks()
    if dtype in given:
        return Peak(given[dtype] * 1e12, f"given by the user (GEMREF_PEAK_TFLOPS {dtype}={given[dtype]:g}), "
                    f"not a datasheet or measured figure", dtype, "user override")
    if device.type == "cuda":
        return gpu_peak(device_name(device), dtype)
    if device.type == "cpu":
        if dtype in CPU_DTYPES:
            return cpu_peak(dtype=dtype)
        return Peak(None, f"N/A: no {dtype} GEMM peak is probed on CPUs (probed: {', '.join(CPU_DTYPES)})", dtype)
    return Peak(None, f"no peak for device type {device.type!r}", dtype)
