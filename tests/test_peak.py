"""The peak an MFU divides by: the CPU probe (path choice, fp32 check, cache key, contention
rule, ISA ceiling), the GPU datasheet table (exact names), and `gemref peak`."""
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gemref.mfu import cpu_probe, gemm_paths, peak
from gemref.env import CpuInfo, cpu_info
from gemref.mfu.cpu_probe import ProbeResult

ZEN4 = CpuInfo("AuthenticAMD", 25, 17, 1, "AMD EPYC", ("fma", "avx2", "avx512f"), cores=2)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMREF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peak, "_PROBED", {})
    monkeypatch.setattr(peak, "cpu_info", lambda: ZEN4)
    monkeypatch.setattr(cpu_probe, "measure_clock_hz", lambda: (3.5e9, "test clock"))
    return tmp_path


def fake_result(flops, share=1.0, path="onednn"):
    return ProbeResult(flops=flops, path=path, shape=(8, 8, 8), rates={path: {"8x8x8": flops}},
                       excluded={}, cpu_share=share, threads=1, seconds=0.1)


def probes_return(monkeypatch, *results):
    """Each call of the probe returns the next result (the last one repeats); counts calls."""
    calls = []

    def probe(dtype="fp32"):
        calls.append(dtype)
        return results[min(len(calls), len(results)) - 1]
    monkeypatch.setattr(cpu_probe, "probe", probe)
    return calls


def cached(cache_dir) -> dict:
    return json.loads((cache_dir / "cpu_peak.json").read_text())


# ---------------------------------------------------------------- which path sets the peak
def test_the_probe_takes_the_fastest_fp32_path_and_never_times_an_excluded_one(monkeypatch):
    rates = {"blas": 111e9, "onednn": 245e9, "mkl_packed": 300e9}
    timed = []
    monkeypatch.setattr(cpu_probe, "check_path", lambda p, dtype: (True, "") if p != "mkl_packed" else (False, "not fp32"))
    monkeypatch.setattr(cpu_probe, "prepare", lambda p, x, w: (lambda: p))
    monkeypatch.setattr(cpu_probe, "_time_call", lambda fn, flops: timed.append(fn()) or rates[fn()] * (
        1 if flops > 2 * 8 ** 3 else 0.5))
    r = cpu_probe.probe(shapes=((8, 8, 8), (16, 16, 16)), paths=tuple(rates), rounds=2)
    assert (r.path, r.flops, r.shape) == ("onednn", 245e9, (16, 16, 16))
    assert r.excluded == {"mkl_packed": "not fp32"} and "mkl_packed" not in timed
    assert r.rates["blas"] == {"8x8x8": 55.5e9, "16x16x16": 111e9}
    assert r.best_rate("blas") == 111e9


def test_a_real_probe_at_a_tiny_shape_covers_every_path():
    r = cpu_probe.probe(shapes=((64, 48, 32),), rounds=1)
    assert set(r.rates) | set(r.excluded) == set(gemm_paths.PROBE_PATHS)
    assert "blas" in r.rates and all(v["64x48x32"] > 0 for v in r.rates.values())
    assert r.flops == max(v["64x48x32"] for v in r.rates.values()) and r.threads == torch.get_num_threads()


def test_a_step_gemm_shape_is_probed_on_the_peak_probes_paths(monkeypatch):
    """probe_gemm (a profiled step's GEMM shapes) times the paths the peak probe would, never an
    excluded one; a batched shape has the one batched path."""
    monkeypatch.setattr(cpu_probe, "check_path", lambda p, dtype: (p != "onednn", "excluded here"))
    r = cpu_probe.probe_gemm(1, 64, 48, 32, reps=2)
    assert set(r["rates"]) <= set(gemm_paths.PROBE_PATHS) - {"onednn"} and "blas" in r["rates"]
    assert r["best_flops_per_s"] == max(r["rates"].values()) == r["rates"][r["best_path"]] > 0
    assert set(cpu_probe.probe_gemm(3, 16, 8, 12, reps=1)["rates"]) == {gemm_paths.BATCHED_PATH}
    x, w = torch.randn(3, 16, 8), torch.randn(3, 12, 8)
    ref = torch.einsum("bmk,bnk->bmn", x.double(), w.double())         # X W^T per batch, in fp64
    assert torch.allclose(gemm_paths.prepare(gemm_paths.BATCHED_PATH, x, w)().double(), ref, atol=1e-5)


def test_a_reduced_precision_path_is_excluded(monkeypatch):
    real = gemm_paths.prepare

    def prepare(path, x, w):
        if path == "onednn":   # what a bf16 "fpmath" GEMM does: round the operands to bf16
            return lambda: (x.bfloat16().float() @ w.bfloat16().float().t())
        return real(path, x, w)
    monkeypatch.setattr(gemm_paths, "prepare", prepare)
    ok, why = gemm_paths.check_fp32("onednn")
    assert not ok and why.startswith("not fp32")
    assert gemm_paths.check_fp32("blas") == (True, "")
    assert gemm_paths.relative_error("blas") < 1e-6


# ---------------------------------------------------------------- cache key and contention
def test_the_cache_key_names_the_cpu_threads_and_torch(cache_dir, monkeypatch):
    calls = probes_return(monkeypatch, fake_result(100e9))
    r = peak.cpu_peak_report()
    assert r["key"] == {"vendor": "AuthenticAMD", "family": 25, "model": 17, "stepping": 1,
                        "flags_sha256": ZEN4.flags_hash, "threads": torch.get_num_threads(),
                        "torch": torch.__version__, "dtype": "fp32", "probe_version": peak.PROBE_VERSION}
    assert list(cached(cache_dir)) == [peak.cache_key(r["key"])]
    monkeypatch.setattr(peak, "_PROBED", {})
    peak.cpu_peak_report()
    assert len(calls) == 1                              # same CPU: the cache answers
    for other in (replace(ZEN4, stepping=2), replace(ZEN4, flags=ZEN4.flags + ("avx512_bf16",)),
                  replace(ZEN4, model=0x11 + 1), replace(ZEN4, vendor="GenuineIntel")):
        monkeypatch.setattr(peak, "cpu_info", lambda other=other: other)
        peak.cpu_peak_report()
    assert len(calls) == 5 and len(cached(cache_dir)) == 5
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)
    assert peak.cpu_peak_report()["key"]["threads"] == 7 and len(calls) == 6


def test_a_contended_probe_is_remeasured_and_not_cached(cache_dir, monkeypatch):
    calls = probes_return(monkeypatch, fake_result(50e9, share=0.5), fake_result(60e9, share=0.6),
                          fake_result(40e9, share=0.7))
    r = peak.cpu_peak_report()
    assert len(calls) == peak.ATTEMPTS and r["attempts"] == peak.ATTEMPTS
    assert r["flops"] == 60e9 and r["contended"] and "not cached" in r["origin"]
    assert not (cache_dir / "cpu_peak.json").exists()
    assert any("not cached" in n for n in r["notes"])
    assert "CONTENDED" in peak.cpu_peak().source


def test_the_first_uncontended_attempt_is_kept_and_cached(cache_dir, monkeypatch):
    calls = probes_return(monkeypatch, fake_result(50e9, share=0.5), fake_result(110e9, share=0.95))
    r = peak.cpu_peak_report()
    assert len(calls) == 2 and r["attempts"] == 2 and not r["contended"]
    assert list(cached(cache_dir).values())[0]["flops"] == 110e9


def test_the_cache_keeps_the_best_uncontended_figure(cache_dir, monkeypatch):
    probes_return(monkeypatch, fake_result(100e9))          # the ceiling: 32 x 3.5 GHz = 112 GFLOP/s
    assert peak.cpu_peak().flops == 100e9
    probes_return(monkeypatch, fake_result(90e9))           # a slower (uncontended) probe
    assert peak.cpu_peak_report(refresh=True)["flops"] == 100e9
    probes_return(monkeypatch, fake_result(110e9))
    assert peak.cpu_peak_report(refresh=True)["flops"] == 110e9
    assert list(cached(cache_dir).values())[0]["flops"] == 110e9


def test_a_corrupt_cache_is_probed_over(cache_dir, monkeypatch):
    (cache_dir / "cpu_peak.json").write_text("{not json")
    probes_return(monkeypatch, fake_result(100e9))
    assert peak.cpu_peak().flops == 100e9


# ---------------------------------------------------------------- the ISA ceiling
@pytest.mark.parametrize("cpu, threads, per_cycle, cores", [
    (ZEN4, 1, 32, 1),                                                     # 2 x 256-bit pipes
    (replace(ZEN4, family=0x1A, model=0x02), 1, 64, 1),                   # Zen 5: 2 x 512-bit
    (replace(ZEN4, family=0x1A, model=0x24), 4, 32, 2),                   # Zen 5 mobile; 2 cores
    (CpuInfo("GenuineIntel", 6, 143, 8, "Xeon", ("fma", "avx2", "avx512f"), 8), 2, 64, 2),
    (CpuInfo("GenuineIntel", 6, 158, 10, "Core", ("fma", "avx2"), 4), 1, 32, 1),
])
def test_the_ceiling_is_lanes_times_pipes_times_clock(cpu, threads, per_cycle, cores):
    c = cpu_probe.isa_ceiling(cpu, threads, 3e9, "given")
    assert c["flop_per_cycle_per_core"] == per_cycle and c["cores"] == cores
    assert c["flops"] == per_cycle * 3e9 * cores


AMX = CpuInfo("GenuineIntel", 6, 143, 8, "Xeon", ("fma", "avx2", "avx512f", "avx512_bf16", "amx_bf16"), 8)


@pytest.mark.parametrize("cpu, per_cycle, isa", [
    (AMX, 1024, "amx_bf16"),                                              # 16x16x32 MACs per 16 cycles
    (replace(AMX, flags=AMX.flags[:-1]), 128, "avx512_bf16"),             # vdpbf16ps: 2 x 2 x 16 lanes x 2 pipes
    (replace(ZEN4, flags=ZEN4.flags + ("avx512_bf16",)), 64, "avx512_bf16"),   # 2 x 2 x 8 lanes (256-bit) x 2
    (ZEN4, 32, "avx512f (no bf16 unit)"),                                 # converted: the fp32 FMA rate
])
def test_the_bf16_ceiling_is_the_cpus_bf16_unit(cpu, per_cycle, isa):
    c = cpu_probe.isa_ceiling(cpu, 1, 2e9, "given", dtype="bf16")
    assert (c["flop_per_cycle_per_core"], c["isa"], c["dtype"]) == (per_cycle, isa, "bf16")
    assert c["flops"] == per_cycle * 2e9
    assert cpu_probe.isa_ceiling(cpu, 1, 2e9, "given")["flop_per_cycle_per_core"] == (64 if cpu.vendor ==
                                                                                        "GenuineIntel" else 32)


def test_each_dtype_has_its_own_probe_and_cache_entry_and_no_other_dtype_borrows(cache_dir, monkeypatch):
    calls = probes_return(monkeypatch, fake_result(100e9))
    assert peak.peak_flops("cpu", "fp32").flops == 100e9 and calls == ["fp32"]
    probes_return(monkeypatch, replace(fake_result(90e9), dtype="bf16"))
    bf16 = peak.peak_flops("cpu", "bf16")
    assert bf16.flops == 90e9 and bf16.dtype == "bf16" and "bf16 GEMM" in bf16.source
    assert sorted(e["dtype"] for e in cached(cache_dir).values()) == ["bf16", "fp32"]
    for dtype in ("fp16", "fp8", "mxfp8", "tf32"):
        p = peak.peak_flops("cpu", dtype)
        assert p.flops is None and "N/A" in p.source and p.dtype == dtype
    entry = next(e for e in cached(cache_dir).values() if e["dtype"] == "fp32")
    assert "bf16" in peak.untrusted(entry, peak.key_fields(ZEN4, dtype="bf16"), {})
    with pytest.raises(ValueError, match="CPU peaks are probed for fp32, bf16"):
        peak.cpu_peak_report(dtype="fp16")


def test_a_real_bf16_probe_at_a_tiny_shape_covers_every_bf16_path():
    r = cpu_probe.probe(shapes=((64, 48, 32),), rounds=1, dtype="bf16")
    assert set(r.rates) | set(r.excluded) == set(gemm_paths.BF16_PROBE_PATHS) and r.dtype == "bf16"
    assert "blas" in r.rates and all(v["64x48x32"] > 0 for v in r.rates.values())


def test_a_bf16_path_must_compute_the_gemm_to_bf16_rounding(monkeypatch):
    for path in gemm_paths.BF16_PROBE_PATHS:
        ok, why = gemm_paths.check_path(path, "bf16")
        assert ok or why == "not in this torch build" or why.startswith("failed"), (path, why)
        if ok:           # fp32 accumulation, one bf16 rounding of the output: ~2^-9 relative, above fp32's
            assert 1e-5 < gemm_paths.relative_error(path, dtype="bf16") <= gemm_paths.TOLERANCE["bf16"]
    real = gemm_paths.prepare
    monkeypatch.setattr(gemm_paths, "prepare", lambda path, x, w: (lambda: real(path, x, w)().flip(1)))   # columns swapped
    ok, why = gemm_paths.check_path("blas", "bf16")
    assert not ok and why.startswith("not bf16")
    assert gemm_paths.check_path("mkl_packed", "bf16") == (False, "no bf16 variant")


def test_no_fma_isa_or_no_clock_means_no_ceiling():
    assert cpu_probe.isa_ceiling(replace(ZEN4, flags=("sse2",)), 1, 3e9, "given")["flops"] is None
    assert cpu_probe.isa_ceiling(ZEN4, 1, None, "unknown")["flops"] is None


@pytest.mark.parametrize("flops, says", [(30e9, "reached 27% of the ISA ceiling"), (100e9, None),
                                         (150e9, "exceeds the ISA ceiling")])
def test_a_probe_far_from_the_ceiling_gets_a_footnote(cache_dir, monkeypatch, flops, says):
    probes_return(monkeypatch, fake_result(flops))                 # ceiling: 32 x 3.5 GHz = 112 GFLOP/s
    notes = peak.cpu_peak_report()["notes"]
    assert (notes == []) if says is None else any(says in n for n in notes)


def test_the_clock_is_measured_on_x86():
    if cpu_probe._dependent_add_loop() is None:
        pytest.skip("no x86-64 executable page here: the clock falls back to /proc/cpuinfo")
    hz, method = cpu_probe.measure_clock_hz(iterations=200_000, repeats=2)
    assert method.startswith("measured") and 3e8 < hz < 8e9     # plausibility, not a timing limit


# ---------------------------------------------------------------- GPU names
@pytest.mark.parametrize("name, dtype, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "bf16", 756),
    ("NVIDIA H100 NVL", "bf16", 835.5), ("NVIDIA H200", "bf16", 989.5), ("NVIDIA H200 NVL", "bf16", 835.5),
    ("NVIDIA H200 NVL", "fp8", 1670.5), ("NVIDIA GH200 480GB", "bf16", 989.5), ("NVIDIA B200", "bf16", 2250),
    ("NVIDIA B200", "mxfp8", 4500), ("NVIDIA GB200", "bf16", 2500), ("NVIDIA GB200", "fp8", 5000),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312), ("NVIDIA A100 80GB PCIe", "tf32", 156), ("H100", "bf16", 989.4),
])
def test_gpu_variants_resolve_to_their_own_row(name, dtype, tflops):
    assert peak.gpu_peak(name, dtype).flops == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("name, dtype", [("NVIDIA H100", "bf16"), ("NVIDIA H100 NVL ", "bf16"),
                                         ("nvidia h200", "bf16"), ("NVIDIA GeForce RTX 4090", "bf16"),
                                         ("NVIDIA B300", "bf16"), ("NVIDIA A100-SXM4-80GB", "fp8"),
                                         ("NVIDIA H200", "mxfp8")])
def test_anything_else_has_no_peak(name, dtype):
    p = peak.gpu_peak(name, dtype)
    assert p.flops is None and "N/A" in p.source


def test_the_cuda_peak_uses_the_exact_device_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 NVL")
    assert peak.peak_flops("cuda", "bf16").flops == pytest.approx(835.5e12)
    with pytest.raises(ValueError, match="dtype='fp64'"):
        peak.gpu_peak("NVIDIA B200", "fp64")


def test_a_user_given_peak_is_used_and_labelled_on_an_unknown_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA B300 SXM6 AC")
    assert peak.peak_flops("cuda", "bf16").flops is None            # not in the table: N/A, not a neighbour's row
    assert "GEMREF_PEAK_TFLOPS" in peak.peak_flops("cuda", "bf16").source
    monkeypatch.setenv("GEMREF_PEAK_TFLOPS", "bf16=2250,fp32=75")
    given = peak.peak_flops("cuda", "bf16")
    assert given.flops == pytest.approx(2250e12) and "given by the user" in given.source
    assert peak.peak_flops("cuda", "fp8").flops is None             # a dtype not given borrows nothing
    assert peak.peak_flops("cpu", "fp32").flops == pytest.approx(75e12)   # any device: the user's word wins


def test_the_peak_flag_reaches_the_run_and_is_refused_when_malformed(monkeypatch, capsys):
    from gemref import cli

    seen = {}
    monkeypatch.setattr("gemref.commands.peak.run", lambda args: seen.update(
        peak=peak.peak_flops("cuda", "bf16").flops) or 0)
    monkeypatch.delenv("GEMREF_PEAK_TFLOPS", raising=False)
    assert cli.main(["peak", "--peak-tflops", "bf16=1000"]) == 0
    assert seen["peak"] == pytest.approx(1000e12) and "GEMREF_PEAK_TFLOPS" not in os.environ   # restored after
    assert cli.main(["peak", "--peak-tflops", "bf16=fast"]) == 2
    err = capsys.readouterr().err
    assert "--peak-tflops" in err and err.count("\n") == 1


# ---------------------------------------------------------------- `gemref peak`
def gemref_peak(*args, env=None):
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "gemref", "peak", *args], capture_output=True, text=True,
                          env=env, cwd=root, timeout=300)


def test_gemref_peak_looks_a_name_up_without_a_gpu(tmp_path):
    out = gemref_peak("--name", "NVIDIA H200 NVL", "--json", str(tmp_path / "p.json"))
    assert out.returncode == 0, out.stderr
    assert "835.5 dense bf16 TFLOP/s" in out.stdout and "H200 NVL column" in out.stdout
    assert json.loads((tmp_path / "p.json").read_text())["peak_flops"] == pytest.approx(835.5e12)


def test_an_unknown_name_is_na_not_an_error(capsys):
    from gemref.cli import main

    assert main(["peak", "--name", "NVIDIA H100"]) == 0
    out = capsys.readouterr().out
    assert "'NVIDIA H100': N/A" in out and "NVIDIA H100 NVL" in out          # the known names are listed


def test_gemref_peak_bad_input_exits_2_with_one_line():
    out = gemref_peak("--dtype", "fp64")
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1 and "--dtype" in err and "fp64" in err


@pytest.mark.parametrize("args, message", [
    (["--device", "tpu"], "--device"),
    (["--name", "NVIDIA B200", "--device", "cpu"], "does not combine with --device cpu"),
    (["--name", " "], "--name is empty"), (["--name", "NVIDIA B200", "--preset", "small"], "--preset"),
    (["--name", "NVIDIA B200", "--json", "/proc/no/such/dir/p.json"], "/proc/no/such/dir/p.json"),
])
def test_every_bad_input_is_one_line(capsys, args, message):
    from gemref.cli import main

    assert main(["peak", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_gemref_peak_cuda_without_a_gpu_exits_2(capsys):
    from gemref.cli import main

    code = main(["peak", "--device", "cuda"])
    if torch.cuda.is_available():
        assert code == 0 and "dense bf16" in capsys.readouterr().out
    else:
        assert code == 2 and "no CUDA device here" in capsys.readouterr().err


def test_gemref_peak_on_cpu_prints_every_path_and_the_ceiling(tmp_path):
    """The subprocess finds this entry under its own key (same CPU, 1 thread): no probe runs. It
    shows the ISA ceiling computed now, not the stored one (the entry is under that ceiling)."""
    fields = peak.key_fields(threads=1)
    cpu = cpu_info()
    now = cpu_probe.isa_ceiling(cpu, 1, *cpu_probe.measure_clock_hz())["flops"]
    best = round(0.5 * now / 1e9) * 1e9 if now else 245e9
    # the stored (stale) ceiling: never the one computed now, whatever clock this run measures
    # (a fixed 256 GFLOP/s is what 64 FLOP/cycle at a measured 4.00 GHz gives)
    stale = round(1.5 * now / 1e9) * 1e9 if now else 256e9
    rates = {"blas": {"512x512x512": 11e9}, "onednn": {"512x512x512": best}}
    entry = {"flops": best, "path": "onednn", "shape": [512, 512, 512], "rates": rates,
             "excluded": {"mkl_packed": "not in this torch build"}, "cpu_share": 0.99, "threads": 1,
             "seconds": 1.0, "contended": False, "attempts": 1, "measured_at": "test",
             "ceiling": {"flops": stale, "flop_per_cycle_per_core": 64, "isa": "avx512f", "fp32_lanes": 16,
                         "fma_pipes": 2, "core_assumption": "test row", "clock_hz": 4e9,
                         "clock_method": "test", "cores": 1}}
    (tmp_path / "cpu_peak.json").write_text(json.dumps({peak.cache_key(fields): entry}))
    out = gemref_peak("--json", str(tmp_path / "p.json"), env={"GEMREF_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert f"CPU fp32 peak: {best / 1e9:.0f} GFLOP/s via onednn" in out.stdout
    for text in ("blas", "11", "excluded: not in this torch build", "ISA ceiling", cpu_probe._core_spec(cpu).label,
                 "cache"):
        assert text in out.stdout
    assert "test row" not in out.stdout and f"ISA ceiling: {stale / 1e9:.0f} GFLOP/s" not in out.stdout
    assert json.loads((tmp_path / "p.json").read_text())["probe"]["rates"] == rates


def test_versus_fp32_pairs_each_shapes_best_path_by_hand():
    low = {"key": {"dtype": "bf16"}, "rates": {"blas": {"8x8x8": 3e9, "16x16x16": 1e9}, "onednn": {"8x8x8": 5e9}}}
    fp32 = {"key": {"dtype": "fp32"}, "rates": {"blas": {"8x8x8": 2e9, "16x16x16": 4e9, "32x32x32": 9e9}}}
    rows = peak.versus_fp32(low, fp32)
    assert [(r["MxKxN"], r["bf16_path"], r["bf16_over_fp32"]) for r in rows] == [("8x8x8", "onednn", 2.5),
                                                                                ("16x16x16", "blas", 0.25)]
    assert rows[0]["bf16_gflops"] == 5.0 and rows[1]["fp32_gflops"] == 4.0


def test_gemref_peak_dtype_bf16_shows_bf16_against_fp32(cache_dir, monkeypatch, capsys):
    from gemref.cli import main

    results = {"fp32": fake_result(100e9, path="blas"), "bf16": replace(fake_result(80e9, path="onednn"), dtype="bf16")}
    monkeypatch.setattr(cpu_probe, "probe", lambda dtype="fp32": results[dtype])
    monkeypatch.setattr(peak, "cpu_info", lambda: replace(ZEN4, flags=ZEN4.flags + ("avx512_bf16",)))
    assert main(["peak", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "CPU bf16 peak: 80 GFLOP/s via onednn" in out and "avx512_bf16" in out
    assert "bf16 is slower than fp32 here at: 8x8x8" in out
    assert main(["peak", "--dtype", "fp16"]) == 2
    assert "--dtype fp16: CPU peaks are probed for fp32, bf16" in capsys.readouterr().err
