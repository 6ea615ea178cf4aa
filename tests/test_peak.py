"""The CPU peak an MFU divides by: the best probe so far, never lowered by a busy machine."""
import json

import pytest

from gemref.mfu import peak


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMREF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peak, "_PROBED", {})
    return tmp_path


def _probe_returns(monkeypatch, flops):
    monkeypatch.setattr(peak, "probe_cpu_gemm", lambda: flops)


def test_a_busy_probe_does_not_lower_the_cached_peak(cache_dir, monkeypatch):
    _probe_returns(monkeypatch, 300e9)
    assert peak.cpu_peak().flops == 300e9
    _probe_returns(monkeypatch, 90e9)                 # the machine is busy this time
    assert peak.cpu_peak(refresh=True).flops == 300e9
    assert list(json.loads((cache_dir / "cpu_peak.json").read_text()).values())[0]["flops"] == 300e9


def test_a_quieter_probe_raises_it_and_a_process_keeps_one_figure(cache_dir, monkeypatch):
    _probe_returns(monkeypatch, 90e9)
    assert peak.cpu_peak().flops == 90e9
    _probe_returns(monkeypatch, 300e9)
    assert peak.cpu_peak().flops == 90e9              # same process: the figure every run here used
    assert peak.cpu_peak(refresh=True).flops == 300e9
    monkeypatch.setattr(peak, "_PROBED", {})          # a new process reads the raised figure
    _probe_returns(monkeypatch, 100e9)
    assert peak.cpu_peak().flops == 300e9


def test_a_corrupt_cache_is_probed_over(cache_dir, monkeypatch):
    (cache_dir / "cpu_peak.json").write_text("{not json")
    _probe_returns(monkeypatch, 200e9)
    assert peak.cpu_peak().flops == 200e9
