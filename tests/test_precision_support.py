"""The gates before a low-precision run (gemref/precision/support.py), with faked versions,
symbols and capabilities: which one fails, in words, and what a chapter then shows."""
import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gemref.measure.quality import variant_support
from gemref.precision import support
from gemref.precision.apply import apply_precision
from gemref.precision.support import native_support, precision_support
from gemref.walkthrough import runnable_precisions, runnable_variants

pytest.importorskip("torchao")


def _fake_gpu(monkeypatch, capability, cuda="12.8", name="A GPU"):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def _without_mxfp8_symbols(monkeypatch):
    """torch as torchao 0.18's MXFP8 training finds torch 2.11 (its DTensor hook missing)."""
    from torch.distributed.tensor import _ops
    monkeypatch.delattr(_ops, "scaled_mm_single_dim_strategy", raising=False)


def test_missing_dtensor_symbols_stop_mxfp8_before_torchao_asserts(monkeypatch):
    _without_mxfp8_symbols(monkeypatch)
    found = precision_support("mxfp8", "cpu")
    assert not found.runs and not found.native
    assert "torch.distributed.tensor._ops.scaled_mm_single_dim_strategy" in found.reason
    assert "MXFP8 training needs symbols torch" in found.reason
    assert precision_support("float8_rowwise", "cpu").runs        # float8 needs no such symbol
    with pytest.raises(ValueError, match="mxfp8 cannot run here: torchao .* needs symbols"):
        apply_precision(nn.Sequential(nn.Linear(64, 64)), "mxfp8", device="cpu")
    _fake_gpu(monkeypatch, (10, 0))                                # not even a Blackwell runs it then
    assert native_support("mxfp8", "cuda") == (False, found.reason)


def test_missing_enum_is_a_missing_symbol(monkeypatch):
    monkeypatch.delattr(F, "SwizzleType", raising=False)
    found = precision_support("mxfp8", "cpu")
    assert not found.runs and "torch.nn.functional.SwizzleType" in found.reason


def test_torchao_older_torch_and_absent_torchao(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.10.0+cu128")
    found = precision_support("float8_rowwise", "cpu")
    assert not found.runs and "needs torch >= 2.11, torch is 2.10.0+cu128" in found.reason
    monkeypatch.undo()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    found = precision_support("float8_tensorwise", "cpu")
    assert not found.runs and "needs torchao, which is not installed" in found.reason
    assert precision_support("bf16", "cpu") == support.Support(True, True, "bf16 GEMMs run natively on cpu")


def test_torchao_without_the_api_gemref_uses(monkeypatch):
    import torchao.prototype.moe_training.config as config
    monkeypatch.delattr(config, "MXFP8TrainingOpConfig")
    found = precision_support("mxfp8", "cpu")
    assert not found.runs and "MXFP8TrainingOpConfig" in found.reason and "torchao 0.18's API" in found.reason


@pytest.mark.parametrize("capability, extension, native, says", [
    ((10, 0), False, False, "torchao's mxfp8 CUDA extension is not loaded"),
    ((10, 0), True, True, "A GPU (SM100) has MXFP8 tensor cores"),
    ((9, 0), True, False, "SM100+ (Blackwell)"),
])
def test_mxfp8_needs_blackwell_and_the_cuda_extension(monkeypatch, capability, extension, native, says):
    _fake_gpu(monkeypatch, capability)
    monkeypatch.setattr("torch.utils._triton.has_triton", lambda: True)
    monkeypatch.setattr(support, "mxfp8_extension_loaded", lambda: extension)
    found = precision_support("mxfp8", "cuda")
    assert found.runs and found.native is native and says in found.reason


def test_float8_needs_sm89(monkeypatch):
    _fake_gpu(monkeypatch, (8, 0))
    assert precision_support("float8_rowwise", "cuda") == support.Support(
        True, False, "float8 GEMMs (torch._scaled_mm) need an NVIDIA GPU of SM89+ (Ada/Hopper or newer); "
                     "found A GPU (SM80)")
    _fake_gpu(monkeypatch, (9, 0), name="H100")
    assert native_support("float8_rowwise", "cuda") == (True, "H100 (SM90) has FP8 tensor cores")


def test_chapters_show_n_a_with_the_reason_and_run_the_rest(monkeypatch, capsys):
    assert runnable_precisions(["fp32", "float8_rowwise", "mxfp8"], "cpu") == ["fp32", "float8_rowwise", "mxfp8"]
    assert capsys.readouterr().out == ""
    _without_mxfp8_symbols(monkeypatch)
    assert runnable_precisions(["fp32", "float8_rowwise", "mxfp8"], "cpu") == ["fp32", "float8_rowwise"]
    assert runnable_variants(["baseline", "mxfp8", "window", "compressed"], "cpu") == \
        ["baseline", "window", "compressed"]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("mxfp8: n/a here, because torchao ") for line in lines)
    assert variant_support("window", "cpu").runs and not variant_support("mxfp8", "cpu").runs


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_high_precision_reason_is_one_sentence_and_loads_no_gate(precision):
    """apply_precision's report and precision_support say the same words for fp32/bf16, and an
    fp32/bf16 run (like `import gemref.train`) never loads the low-precision gates (support.py)."""
    import subprocess
    import sys

    report = apply_precision(torch.nn.Sequential(torch.nn.Linear(8, 8)), precision, device="cpu")
    assert report.reason == precision_support(precision, "cpu").reason == f"{precision} GEMMs run natively on cpu"
    probe = ("import sys, torch, gemref.train\nfrom gemref.precision.apply import apply_precision\n"
             f"apply_precision(torch.nn.Sequential(torch.nn.Linear(8, 8)), {precision!r}, device='cpu')\n"
             "print('gemref.precision.support' in sys.modules)")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == ["False"]
