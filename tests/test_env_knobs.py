"""Environment variables set to garbage: one line naming the variable and its valid
values, exit status 2, through `gemref flops` (it resolves the device, which checks the
environment, then sets up the run, which checks GEMREF_GDPA) and through each variable's reader."""
from __future__ import annotations

import pytest

from gemref import cli, env
from gemref.attention.cpu_fused import build
from gemref.attention.triton import variant
from gemref.data import shards
from gemref.data.movielens import fetch
from gemref.errors import UsageError
from gemref.mfu import peak
from gemref.options import max_local_ranks
from gemref.precision import fast_linear

FILE = "<an existing file>"      # replaced by a real file's path
PATHS = ["", " ", "~/cache", " /tmp/x", "/tmp/x ", "a\nb", "a\tb", FILE]
GARBAGE = {
    "GEMREF_GDPA": ["", "  ", "-1", "abc", "/tmp/x", "../x", "schedule=nope", "silu_tanh=2", "fwd=3x3", "=1"],
    "GEMREF_CPU_GEMM": ["", " ", "-1", "0", "abc", "/tmp/x", "../x", "mkl"],
    "GEMREF_MAX_RANKS": ["", " ", "-1", "0", "abc", "1.5", "1e3", "/tmp/x", "../x", "²", "0x10"],
    "OMP_NUM_THREADS": ["", " ", "-1", "0", "abc", "1.5", "/tmp/x", "../x", "4,", ",4", "4,0", "²"],
    "GEMREF_CACHE_DIR": PATHS,
    "GEMREF_DATA_DIR": PATHS,
    "GEMREF_PEAK_TFLOPS": ["", " ", "989", "bf16", "bf16=", "bf16=-1", "bf16=0", "bf16=inf", "bf16=nan",
                           "fp64=10", "bf16=1,bf16=2", "bf16=1;fp32=2", "H100=989"],
}
CASES = [(name, value) for name, values in GARBAGE.items() for value in values]
READERS = {
    "GEMREF_GDPA": [variant.current_variant],
    "GEMREF_CPU_GEMM": [fast_linear.gemm_mode],
    "GEMREF_MAX_RANKS": [lambda: max_local_ranks("cpu")],
    "OMP_NUM_THREADS": [env.knobs],
    "GEMREF_CACHE_DIR": [lambda: env.cache_root(), build.cache_dir, peak.cache_path, fetch.wheel_cache],
    "GEMREF_DATA_DIR": [shards.default_data_root],
    "GEMREF_PEAK_TFLOPS": [env.env_peaks, lambda: peak.peak_flops("cpu", "fp32")],
}


def set_garbage(monkeypatch, tmp_path, name: str, value: str) -> str:
    if value == FILE:
        (tmp_path / "a-file").write_text("")
        value = str(tmp_path / "a-file")
    monkeypatch.setenv(name, value)
    return value


@pytest.mark.parametrize("name, value", CASES)
def test_garbage_in_a_knob_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys, name, value):
    set_garbage(monkeypatch, tmp_path, name, value)
    assert cli.main(["flops", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gemref flops: error: ") and err.count("\n") == 1, err
    assert name in err and "valid" in err and "Traceback" not in err


@pytest.mark.parametrize("name, value", CASES)
def test_each_reader_refuses_garbage_naming_the_variable(monkeypatch, tmp_path, name, value):
    set_garbage(monkeypatch, tmp_path, name, value)
    for read in READERS[name]:
        with pytest.raises(UsageError, match=name):
            read()


@pytest.mark.parametrize("name, value, read, expected", [
    ("GEMREF_CPU_GEMM", " BLAS ", fast_linear.gemm_mode, "blas"),
    ("GEMREF_MAX_RANKS", "8", lambda: max_local_ranks("cpu")[0], 8),
    ("OMP_NUM_THREADS", "4,1", lambda: env.knobs()["OMP_NUM_THREADS"], "4,1"),
    ("GEMREF_GDPA", "silu_tanh,schedule=grouped", lambda: variant.current_variant().schedule, "grouped"),
    ("GEMREF_CACHE_DIR", "relative/cache", lambda: str(env.cache_root()), "relative/cache"),
    ("GEMREF_DATA_DIR", "/srv/data", lambda: str(shards.default_data_root()), "/srv/data"),
    ("GEMREF_PEAK_TFLOPS", " bf16 = 989 ,fp32=67", env.env_peaks, {"bf16": 989.0, "fp32": 67.0})])
def test_valid_values_are_read(monkeypatch, name, value, read, expected):
    monkeypatch.setenv(name, value)
    env.check_environment()
    assert read() == expected


def test_every_knob_a_record_names_is_checked_or_has_its_own_reader():
    assert set(env.KNOBS) - set(env.CHECKS) == {"GEMREF_GDPA", "TRITON_INTERPRET"}
    assert set(GARBAGE) == set(env.CHECKS) | {"GEMREF_GDPA"}


@pytest.mark.parametrize("name", sorted(env.CHECKS))
def test_a_command_that_never_resolves_a_device_checks_the_environment_too(monkeypatch, tmp_path, capsys, name):
    set_garbage(monkeypatch, tmp_path, name, "")              # refused by every kind of knob
    assert cli.main(["data", "check", str(tmp_path / "no-such-folder")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gemref data check: error: ") and name in err and err.count("\n") == 1, err
