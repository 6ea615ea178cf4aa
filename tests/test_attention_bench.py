"""`gemref bench attention`: a tiny run end to end, its record, its length profiles, its errors."""
from __future__ import annotations

import json

import pytest
import torch

from gemref.data.lengths import LENGTH_PROFILES, make_lengths
from gemref.cli import main


def test_bench_attention_tiny_run_writes_its_record(tmp_path, capsys):
    path = tmp_path / "attention.json"
    rc = main(["bench", "attention", "--lengths", "64", "--skews", "skewed", "--activations", "softmax",
               "silu", "--reps", "1", "--warmup", "0", "--threads", "1", "--json", str(path)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "speedup_fwdbwd" in printed and "skipped triton" in printed
    record = json.loads(path.read_text())
    assert record["bench"] == "attention" and record["threads"] == 1
    kernels = {(r["activation"], r["kernel"]) for r in record["rows"]}
    assert kernels == {("softmax", "reference"), ("softmax", "sdpa"), ("softmax", "cpu_jagged"),
                       ("silu", "reference"), ("silu", "cpu_jagged"), ("silu", "cpu_fused")}
    for row in record["rows"]:
        assert row["fwd_ms"] > 0 and row["fwdbwd_ms"] > 0 and row["peak_mib"] > 0
        assert row["speedup_fwd"] > 0 and row["fwd_tflops"] > 0
        if row["kernel"] == "reference":
            assert row["speedup_fwd"] == 1.0
    by_kernel = {(r["activation"], r["kernel"]): r for r in record["rows"]}
    # A skewed batch: padding makes the reference execute far more than the model FLOPs.
    assert by_kernel[("silu", "reference")]["exec_over_model"] > 2 * by_kernel[("silu", "cpu_jagged")]["exec_over_model"]


@pytest.mark.parametrize("profile", LENGTH_PROFILES)
def test_length_profiles_are_deterministic_and_hold_the_max(profile):
    lengths = make_lengths(profile, 256, 2048, seed=3)
    assert lengths == make_lengths(profile, 256, 2048, seed=3)
    assert lengths[0] == 256 and max(lengths) == 256 and min(lengths) >= 1 and sum(lengths) >= 2048
    if profile == "fixed":
        assert set(lengths) == {256}
    if profile == "skewed":  # mostly short histories
        assert torch.tensor(lengths, dtype=torch.float).median() < 256 / 4


@pytest.mark.parametrize("argv,message", [
    (["--kernels", "nope"], "unknown kernels ['nope']"),
    (["--device", "cuda"], "no CUDA device"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--heads", "0"], "--heads must be >= 1"),
])
def test_bench_attention_user_errors_exit_2(argv, message, capsys):
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["bench", "attention", "--lengths", "32", *argv]) == 2
    assert message in capsys.readouterr().err
