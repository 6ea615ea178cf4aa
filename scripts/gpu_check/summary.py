"""What the GPU check's driver writes: the environment record (without importing torch: that
is the children's job), the summary file (rewritten atomically after every section), and the
few headline lines printed at the end (the JSON has everything)."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
from pathlib import Path

from .children import ROOT

PACKAGES = ("torch", "triton", "numpy", "pyarrow", "yaml", "hypothesis", "tqdm", "narwhals", "packaging",
            "torchao", "plotly", "flash_attn")


def environment(dry_run: bool) -> dict:
    """Python, packages, wheels (as scripts/gpu_check.sh reported them), nvidia-smi, git."""
    def version(name):
        if importlib.util.find_spec(name) is None:
            return None
        dist = {"yaml": "PyYAML"}.get(name, name)
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "present (version unknown)"

    def command(*cmd):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=15, cwd=ROOT)
            return (out.stdout.strip() or out.stderr.strip())[:2000]
        except (OSError, subprocess.SubprocessError) as e:
            return f"unavailable: {type(e).__name__}"

    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "packages": {name: version(name) for name in PACKAGES},
            "wheels": os.environ.get("GPU_CHECK_WHEELS", "not reported (run through scripts/gpu_check.sh)"),
            "wheel_site": sorted(os.listdir(site)) if (site := os.environ.get("GPU_CHECK_SITE")) and
            os.path.isdir(site) else None,
            "nvidia_smi": None if dry_run else command("nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                                                       "clocks.max.sm,power.limit", "--format=csv"),
            "git": command("git", "rev-parse", "--short", "HEAD"),
            "GEMREF_GDPA": os.environ.get("GEMREF_GDPA", "")}


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def headline(summary: dict) -> list[str]:
    """A few lines of the figures that matter, for the console."""
    sections = summary["sections"]
    lines = []
    ceil = sections.get("ceilings", {}).get("result", {})
    if "gemm_bf16" in ceil:
        lines.append(f"ceilings: GEMM {ceil['gemm_bf16']['tflops']:.0f} TFLOP/s, "
                     f"copy {ceil.get('copy_d2d', {}).get('gb_per_s', float('nan')):.0f} GB/s on {ceil.get('gpu', ceil['device'])}")
    corr = sections.get("correctness", {}).get("result", {})
    if corr:
        bad = [c["name"] for c in corr.get("cases", []) + corr.get("determinism", []) if not c.get("passed")]
        lines.append(f"correctness: {corr.get('passed', 0)} passed, {corr.get('failed', 0)} failed {bad or ''}")
    for row in sections.get("timing", {}).get("result", {}).get("rows", []):
        figures = (f"fwd {row['fwd_model_tflops']:7.1f}  bwd {row['bwd_model_tflops']:7.1f} TFLOP/s (model)"
                   if "fwd_ms" in row else row.get("error", ""))
        lines.append(f"timing {row['profile']:6} {row['activation']:7} {row['kernel']:22} {figures}")
    if (pick := summary.get("gdpa_default")) is not None:
        lines.append(f"GDPA default by the rule: {pick['winner']} ({pick.get('spec', pick['reason'])}); "
                     f"fwd {pick.get('fwd_winner')}, bwd {pick.get('bwd_winner')}")
    rungs = sections.get("rungs", {}).get("result", {}).get("rungs", [])
    if measured := [r for r in rungs if r.get("mfu") is not None]:
        best = max(measured, key=lambda r: r["mfu"])
        lines.append(f"best rung: {best['rung']} at MFU {best['mfu']:.3f} (batch {best['batch_size']})")
    for rung in rungs:
        mfu = (f"MFU {rung['mfu']:.3f}" if rung.get("mfu") is not None else
               rung.get("error", rung["status"]) if rung.get("status") != "ran" else
               f"no MFU: {rung.get('windows_kept')} of {rung.get('windows')} windows kept, "
               f"{rung.get('contended_windows')} contended attempts")
        lines.append(f"rung {rung.get('rung', '?'):18} batch {rung.get('batch_size', '?')} {mfu}")
    return lines
