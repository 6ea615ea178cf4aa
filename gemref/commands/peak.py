"""`gemref peak`: the peak FLOP/s an MFU divides by, where it comes from and how it was found.

  gemref peak                      this CPU: the fp32 peak (probe or cache), every GEMM path's
                                   rate per shape, the ISA ceiling, footnotes
  gemref peak --dtype bf16         ... the bf16 peak (oneDNN, on AMX where there is one), its
                                   ceiling, and bf16 against fp32 at every probed shape
  gemref peak --preset small       ... and the path each of that preset's Linear shapes uses
  gemref peak --device cuda        this machine's GPU, looked up in the datasheet table
  gemref peak --name "NVIDIA H200 NVL"   a GPU name looked up without a GPU (exact names)

Bad input (unknown device or dtype, --name with --device cpu, no CUDA for --device cuda, an
unwritable --json path) is a UsageError: `gemref` prints one line and exits 2. A GPU name
that is not in the table is not an error: its peak is N/A, as it would be in an MFU.
"""
from __future__ import annotations

import argparse

from ..train.presets import PRESETS
from ..errors import UsageError
from ..mfu.gpu_table import DTYPES   # a plain table: no torch at import
from ..report import fmt, format_table
from ..runtime.files import write_json
from ..options import add_device_arg, output_file

NAME = "peak"
HELP = "the peak FLOP/s MFU divides by: its source, every CPU GEMM path's rate, the ISA ceiling"


def configure(p: argparse.ArgumentParser) -> None:
    add_device_arg(p)
    p.add_argument("--name", help="look this exact GPU name up in the datasheet table (no GPU needed)")
    p.add_argument("--dtype", choices=DTYPES, help="default: fp32 on CPU, bf16 on GPU")
    p.add_argument("--preset", choices=list(PRESETS),
                   help="CPU: also show the GEMM path each Linear shape of this preset uses")
    p.add_argument("--refresh", action="store_true", help="CPU: probe again (the cache keeps the best)")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the report here")
    p.set_defaults(func=run)


def _gpu_report(name: str, dtype: str) -> dict:
    from ..mfu.gpu_table import GPU_TABLE, PROFILE_GPUS, lookup
    from ..mfu.peak import gpu_peak

    peak = gpu_peak(name, dtype)
    found = lookup(name)
    row = {d: (found[1].flops(d) if found else None) for d in DTYPES}
    lines = [f"GPU {name!r}: {f'{peak.flops / 1e12:,.1f}' if peak.flops else 'N/A'} dense {dtype} TFLOP/s "
             "(the peak MFU divides by)", f"source: {peak.source}", f"method: {peak.method}"]
    if found is None:
        lines.append("known names: " + "; ".join(sorted(GPU_TABLE)) + "; profile names: " + ", ".join(PROFILE_GPUS))
    table = format_table([{"dtype": d, "dense_tflops": None if v is None else f"{v / 1e12:,.1f}"}
                          for d, v in row.items()],
                         title=f"{found[0] if found else name}: every dtype")
    return {"device": "cuda", "name": name, "dtype": dtype, "peak_flops": peak.flops, "source": peak.source,
            "method": peak.method, "dense_flops": row, "lines": lines + [table]}


def _cpu_report(dtype: str, preset: str | None, refresh: bool) -> dict:
    from ..mfu.peak import CPU_DTYPES, cpu_peak, cpu_peak_report, versus_fp32

    if dtype not in CPU_DTYPES:
        raise UsageError(f"--dtype {dtype}: CPU peaks are probed for {', '.join(CPU_DTYPES)} (no other dtype has one)")
    report = cpu_peak_report(refresh, dtype)
    peak = cpu_peak(dtype=dtype)
    shapes = sorted({s for rates in report["rates"].values() for s in rates},
                    key=lambda s: [int(v) for v in s.split("x")])
    rows = []
    for path, rates in report["rates"].items():
        best = max(rates, key=rates.get)
        rows.append({"path": path, "best_gflops": rates[best] / 1e9, "at_MxKxN": best,
                     "of_peak": rates[best] / report["flops"], **{s: rates.get(s, 0) / 1e9 for s in shapes}})
    rows += [{"path": path, "at_MxKxN": f"excluded: {why}"} for path, why in report["excluded"].items()]
    c = report["ceiling"]
    ceiling = (f"{dtype} ISA ceiling: {fmt(c['flops'] / 1e9)} GFLOP/s = {c['flop_per_cycle_per_core']} FLOP/cycle/core "
               f"({c['formula']}) x {c['clock_hz'] / 1e9:.2f} GHz x {c['cores']} core(s); probe at "
               f"{report['flops'] / c['flops']:.0%} of it" if c.get("flops") else f"{dtype} ISA ceiling: unknown")
    k = report["key"]
    lines = [f"CPU {dtype} peak: {fmt(report['flops'] / 1e9)} GFLOP/s via {report['path']} (the peak a run whose "
             f"GEMMs run in {dtype} divides its MFU by)",
             f"source: {peak.source}", f"method: {peak.method}",
             f"cache key: {k['vendor']} family {k['family']} model {k['model']} stepping {k['stepping']}, flags "
             f"sha256 {k['flags_sha256']}, {k['threads']} thread(s), torch {k['torch']}, {k['dtype']}, "
             f"probe v{k['probe_version']}",
             format_table(rows, title=f"GFLOP/s per {dtype} GEMM path and shape (M x K x N), best of the rounds"),
             ceiling, f"  core assumption: {c.get('core_assumption')}", f"  clock: {c.get('clock_method')}",
             f"probe: {report['cpu_share']:.0%} of its cores over {report['seconds']:.1f} s, "
             f"{report['attempts']} attempt(s); {report['origin']}"]
    out = {"device": "cpu", "dtype": dtype, "peak_flops": report["flops"], "source": peak.source,
           "method": peak.method, "probe": {k: v for k, v in report.items() if k != "notes"},
           "notes": report["notes"]}
    if dtype != "fp32":
        out["versus_fp32"] = versus_fp32(report, cpu_peak_report(refresh, "fp32"))
        slower = [r["MxKxN"] for r in out["versus_fp32"] if r[f"{dtype}_over_fp32"] < 1]
        lines.append(format_table(out["versus_fp32"], title=f"{dtype} against fp32 per shape (each dtype's best path)"))
        lines.append(f"{dtype} is slower than fp32 here at: {', '.join(slower)}" if slower
                     else f"{dtype} is at least as fast as fp32 at every shape probed in both")
    if preset:
        out["model_linears"] = _preset_plan(preset)
        lines.append(format_table(out["model_linears"]["shapes"], title=(
            f"{preset}: GEMM path per Linear shape (GEMREF_CPU_GEMM={out['model_linears']['mode']}, "
            f"{out['model_linears']['layers']} layers)")))
    lines += [f"note {i}: {n}" for i, n in enumerate(report["notes"], 1)]
    out["lines"] = lines
    return out


def _preset_plan(preset: str) -> dict:
    from ..train.presets import get_preset
    from ..model.gem import GEMRef
    from ..precision.fast_linear import use_fastest_cpu_gemms

    cfg = get_preset(preset).model      # ValueError for an unknown preset
    return use_fastest_cpu_gemms(GEMRef(cfg, jagged=True), "cpu")


def run(args: argparse.Namespace) -> int:
    import torch

    device = "cuda" if args.name is not None and args.device == "auto" else args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = args.dtype or ("fp32" if device == "cpu" else "bf16")
    if args.name is not None and device == "cpu":
        raise UsageError("--name looks a GPU up in the datasheet table; it does not combine with --device cpu")
    if args.name is not None and not args.name.strip():
        raise UsageError("--name is empty; give a device name as torch.cuda.get_device_name() prints it")
    if device == "cuda" and args.name is None and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device here; --name NAME looks a GPU name up without one")
    if args.preset and device != "cpu":
        raise UsageError("--preset shows the CPU GEMM path per Linear shape; it needs --device cpu")
    if device == "cpu":
        report = _cpu_report(dtype, args.preset, args.refresh)
    else:
        report = _gpu_report(args.name if args.name is not None else torch.cuda.get_device_name(), dtype)
    print("\n".join(report.pop("lines")))
    if args.json:
        write_json(args.json, report)
    return 0
