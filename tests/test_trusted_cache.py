"""Caches are trusted only when they are ours: the cache folder and file must be
this user's and not writable by group or others (files.private_path; the stat is faked, the
tests run as root); cpu_fused loads a library only if its sha256 is the one its build
recorded; a cached CPU peak that is malformed, for other threads or above the ISA ceiling
computed now is measured again."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from gemref.runtime import files
from gemref.attention.cpu_fused import build
from gemref.env import CpuInfo
from gemref.errors import UsageError
from gemref.mfu import cpu_probe, peak
from gemref.mfu.cpu_probe import ProbeResult

STUB = r'''
#include <cstdint>
extern "C" {
int64_t gemref_gdpa_f32() { return 0; }
int64_t gemref_gdpa_f64() { return 0; }
int64_t gemref_gdpa_bf16() { return 0; }
int64_t gemref_gdpa_bf16_amx() { return 0; }
int64_t gemref_gdpa_bf16_amx_emulated() { return 0; }
int gemref_stub_id() { return 42; }
}
'''
PLANTED = r'''
#include <stdio.h>
#include <stdint.h>
__attribute__((constructor)) static void planted(void) { FILE *f = fopen("%s", "w"); if (f) fclose(f); }
int64_t gemref_gdpa_f32(void) { return 0; }
int64_t gemref_gdpa_f64(void) { return 0; }
int64_t gemref_gdpa_bf16(void) { return 0; }
int64_t gemref_gdpa_bf16_amx(void) { return 0; }
int64_t gemref_gdpa_bf16_amx_emulated(void) { return 0; }
'''


def fake_stat(monkeypatch, path: Path, uid: int | None = None, mode: int | None = None) -> None:
    """files._stat reports `path` with another owner and/or permission bits."""
    real = os.stat

    def stat(p):
        st = real(p)
        if Path(p) != Path(path):
            return st
        fields = list(st)
        fields[0] = st.st_mode if mode is None else (st.st_mode & ~0o777) | mode
        fields[4] = st.st_uid if uid is None else uid
        return os.stat_result(fields)
    monkeypatch.setattr(files, "_stat", stat, raising=False)


# ---------------------------------------------------------------- the rule
def test_private_path_creates_missing_folders_owner_only_and_accepts_its_own(tmp_path):
    path = files.private_path(tmp_path / "a" / "b", "x.json")
    assert path == tmp_path / "a" / "b" / "x.json"
    assert [(tmp_path / p).stat().st_mode & 0o777 for p in ("a", "a/b")] == [0o700, 0o700]


@pytest.mark.parametrize("uid, mode, says", [(os.geteuid() + 1, None, "not by this user"),
                                             (None, 0o775, "chmod go-w"), (None, 0o757, "chmod go-w")])
@pytest.mark.parametrize("which", ["folder", "file"])
def test_private_path_refuses_another_owner_or_group_or_world_write(tmp_path, monkeypatch, uid, mode, says, which):
    (tmp_path / "f").write_text("{}")
    fake_stat(monkeypatch, tmp_path if which == "folder" else tmp_path / "f", uid=uid, mode=mode)
    with pytest.raises(UsageError, match=says) as e:
        files.private_path(tmp_path, "f")
    assert str(tmp_path if which == "folder" else tmp_path / "f") in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- cpu_fused's library
@pytest.fixture
def stub_kernel(tmp_path, monkeypatch):
    """cpu_fused with a tiny stand-in source (builds in a second), cached under tmp_path/cache;
    returns the library path _load uses."""
    if build.compiler() is None or shutil.which("cc") is None:
        pytest.skip("needs a C and a C++ compiler")
    source = tmp_path / "stub.cpp"
    source.write_text(STUB)
    monkeypatch.setattr(build, "SOURCES", (source,))
    monkeypatch.setattr(build, "HEADERS", ())
    monkeypatch.setenv("GEMREF_CACHE_DIR", str(tmp_path / "cache"))
    return build.cache_dir() / f"cpu_fused-{build._key(build.compiler())}.so"


def plant(target: Path, marker: Path) -> None:
    """A library whose constructor writes `marker` when it is loaded, at `target`."""
    source = marker.with_name("planted.c")
    source.write_text(PLANTED % marker)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(target)], check=True, timeout=120)


def is_stub(lib) -> bool:
    return not isinstance(lib, str) and lib.gemref_stub_id() == 42


@pytest.mark.parametrize("sidecar", [None, "0" * 64, "built-by-someone-else"])
def test_a_planted_library_is_never_loaded_but_rebuilt(stub_kernel, tmp_path, caplog, sidecar):
    marker = tmp_path / "constructor-ran"
    plant(stub_kernel, marker)
    if sidecar is not None:
        stub_kernel.with_name(stub_kernel.name + ".sha256").write_text(sidecar)
    lib = build._load()
    assert not marker.exists(), "the planted library was loaded"
    assert is_stub(lib), lib
    assert "rebuilding" in caplog.text and ("no sha256" in caplog.text or "not the one recorded" in caplog.text)
    recorded = stub_kernel.with_name(stub_kernel.name + ".sha256").read_text().strip()
    assert recorded == build._sha256(stub_kernel)


def test_a_truncated_library_is_rebuilt_and_a_verified_one_is_loaded_without_a_build(stub_kernel, monkeypatch):
    stub_kernel.parent.mkdir(parents=True)
    assert build._build(build.compiler(), stub_kernel) is None          # built, not loaded yet
    stub_kernel.write_bytes(stub_kernel.read_bytes()[:1000])            # (a loaded library must not change)
    assert is_stub(build._load())
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("rebuilt a verified library"))
    monkeypatch.setattr(build, "_key", lambda cxx: stub_kernel.stem.split("-", 1)[1])
    assert is_stub(build._load())


@pytest.mark.parametrize("which", ["folder", "library"])
def test_a_library_in_a_folder_others_can_write_is_refused(stub_kernel, tmp_path, monkeypatch, which):
    marker = tmp_path / "constructor-ran"
    plant(stub_kernel, marker)
    fake_stat(monkeypatch, stub_kernel.parent if which == "folder" else stub_kernel, mode=0o777)
    with pytest.raises(UsageError, match="chmod go-w"):
        build._load()
    assert not marker.exists()


# ---------------------------------------------------------------- the cached CPU peak
ZEN4 = CpuInfo("AuthenticAMD", 25, 17, 1, "AMD EPYC", ("fma", "avx2", "avx512f"), cores=2)
CLOCK = 3.5e9


@pytest.fixture
def peak_cache(tmp_path, monkeypatch):
    """The peak module on a fake Zen 4 at a fixed clock; probes counted, each 50 GFLOP/s."""
    monkeypatch.setenv("GEMREF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peak, "_PROBED", {})
    monkeypatch.setattr(peak, "cpu_info", lambda: ZEN4)
    monkeypatch.setattr(cpu_probe, "measure_clock_hz", lambda: (CLOCK, "test clock"))
    calls = []
    monkeypatch.setattr(cpu_probe, "probe", lambda dtype="fp32": calls.append(1) or ProbeResult(
        flops=50e9, path="blas", shape=(8, 8, 8), rates={"blas": {"8x8x8": 50e9}}, excluded={}, cpu_share=1.0,
        threads=torch.get_num_threads(), seconds=0.1))
    return calls


def plant_peak(folder: Path, **changes) -> None:
    fields = peak.key_fields(ZEN4)
    entry = {"flops": 90e9, "path": "onednn", "shape": [8, 8, 8], "rates": {"onednn": {"8x8x8": 90e9}},
             "excluded": {}, "cpu_share": 0.99, "threads": fields["threads"], "seconds": 1.0, "contended": False,
             "attempts": 1, "measured_at": "planted",
             "ceiling": {"flops": 1e15, "flop_per_cycle_per_core": 64, "isa": "avx512f", "fp32_lanes": 16, "fma_pipes": 2,
                         "core_assumption": "planted", "clock_hz": 1e13, "clock_method": "planted", "cores": 1}}
    entry.update(changes)
    (folder / "cpu_peak.json").write_text(json.dumps({peak.cache_key(fields): entry}))


def test_a_trusted_cached_peak_is_used_with_the_ceiling_computed_now(tmp_path, peak_cache):
    plant_peak(tmp_path)
    r = peak.cpu_peak_report()
    assert r["flops"] == 90e9 and peak_cache == []
    assert r["ceiling"]["flops"] == cpu_probe.isa_ceiling(ZEN4, torch.get_num_threads(), CLOCK, "")["flops"]


def test_a_cached_peak_above_the_isa_ceiling_is_measured_again(tmp_path, peak_cache, caplog):
    ceiling = cpu_probe.isa_ceiling(ZEN4, torch.get_num_threads(), CLOCK, "")["flops"]
    plant_peak(tmp_path, flops=2 * ceiling, rates={"onednn": {"8x8x8": 2 * ceiling}})
    assert peak.cpu_peak().flops == 50e9 and peak_cache == [1]
    assert "above the ISA ceiling" in caplog.text


@pytest.mark.parametrize("changes, says", [
    ({"flops": math.nan}, "malformed"), ({"flops": -1.0}, "malformed"), ({"flops": True}, "malformed"),
    ({"shape": None}, "malformed"), ({"rates": [1]}, "malformed"), ({"cpu_share": 0.3}, "contended"),
    ({"threads": 999}, "999 threads")])
def test_a_malformed_or_foreign_cached_peak_is_measured_again(tmp_path, peak_cache, caplog, changes, says):
    plant_peak(tmp_path, **changes)
    assert peak.cpu_peak().flops == 50e9 and peak_cache == [1]
    assert says in caplog.text


@pytest.mark.parametrize("uid, mode", [(os.geteuid() + 1, None), (None, 0o664)])
@pytest.mark.parametrize("which", ["folder", "file"])
def test_a_peak_cache_others_can_write_is_refused(tmp_path, peak_cache, monkeypatch, uid, mode, which):
    plant_peak(tmp_path)
    fake_stat(monkeypatch, tmp_path if which == "folder" else tmp_path / "cpu_peak.json", uid=uid, mode=mode)
    with pytest.raises(UsageError, match="cpu_peak.json" if which == "file" else "GEMREF_CACHE_DIR"):
        peak.cpu_peak()
    assert peak_cache == []


def test_the_peak_cache_is_written_owner_only(tmp_path, peak_cache):
    peak.cpu_peak()
    assert (tmp_path / "cpu_peak.json").stat().st_mode & 0o777 == 0o600
