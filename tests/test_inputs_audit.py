"""The input audit's second pass: the members of its classes that the first pass missed, each a one-line
error (CLI exit 2, API ValueError) instead of a traceback, a silent no-op or a clamp.

Typed values and ranges (1): huge seeds, windows wider than max_len, checkpoint settings that
save nothing. Paths (2): a data folder that is a file or cannot be created, an empty --json.
Limits (8): datasets that cannot fit the disk, DataLoader workers, one-process switches.
User errors vs bugs (9): a kernel or precision kernel that cannot run here, a notebook that
refuses a parameter. gdpa misuse (6): scales and max-length hints.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gemref.attention.api import gdpa
from gemref.cli import main
from gemref.options import RANKS_PER_CPU, check_output_file, check_workers
from gemref.config.checks import MAX_SEED
from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.data.shards import default_data_root, generate_dataset, min_dataset_bytes
from gemref.errors import UsageError

TINY = get_preset("tiny")


def one_error_line(code: int, err: str) -> str:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def cli(capsys):
    def run(*args):
        code = main(list(args))
        return one_error_line(code, capsys.readouterr().err)
    return run


# ----------------------------------------------------------------------------- 1. values and ranges


@pytest.mark.parametrize("cfg, change, message", [
    (TINY.train, {"seed": MAX_SEED + 1}, "TrainConfig.seed must be in [0, 2**63 - 1]"),
    (TINY.data, {"seed": 2 ** 70}, "DataConfig.seed must be in [0, 2**63 - 1]"),
    (TINY.model, {"window": TINY.model.max_len + 1}, "ModelConfig.window must be None (full causal) or in [1, max_len=64]"),
    (TINY.train, {"checkpoint_dir": "ck"}, "checkpoint_every=0 and no resume: nothing would be saved"),
    (TINY.train, {"checkpoint_dir": "ck", "checkpoint_every": 5, "steps": 2}, "checkpoint_every=5 exceeds steps=2"),
])
def test_config_ranges_the_first_pass_missed(cfg, change, message):
    with pytest.raises(UsageError) as e:
        override(cfg, **change)
    assert message in str(e.value)


def test_config_range_edges_still_accepted():
    assert override(TINY.train, seed=MAX_SEED).seed == MAX_SEED
    assert override(TINY.model, window=TINY.model.max_len).window == TINY.model.max_len
    assert override(TINY.train, checkpoint_dir="ck", resume=True).checkpoint.resume      # resume without saving more
    assert override(TINY.train, checkpoint_dir="ck", checkpoint_every=2, steps=2).checkpoint.every == 2


def test_a_huge_seed_through_the_real_cli():
    r = subprocess.run([sys.executable, "-m", "gemref", "train", "--set", f"seed={2 ** 70}"],
                       capture_output=True, text=True, timeout=300)
    assert "TrainConfig.seed must be in [0, 2**63 - 1]" in one_error_line(r.returncode, r.stderr)


# ----------------------------------------------------------------------------- 2. paths


def test_an_empty_output_path_is_refused():
    with pytest.raises(UsageError, match="--json: empty path"):
        check_output_file("", "--json")


def test_a_data_folder_that_is_a_file(tmp_path, monkeypatch, cli):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    monkeypatch.setenv("GEMREF_DATA_DIR", str(a_file))
    with pytest.raises(UsageError, match=f"GEMREF_DATA_DIR={a_file}: is a file"):
        default_data_root()
    assert f"GEMREF_DATA_DIR={a_file}: is a file" in cli("train", "--steps", "1", "--quiet")
    monkeypatch.setenv("GEMREF_DATA_DIR", str(a_file / "sub"))     # under a file: cannot be created
    assert f"data folder {a_file / 'sub'}" in cli("train", "--steps", "1", "--quiet")


# ----------------------------------------------------------------------------- 8. limits


def test_a_dataset_larger_than_the_disk_is_refused_before_writing(tmp_path, cli):
    data = override(TINY.data, n_train=10 ** 12)
    free = shutil.disk_usage(tmp_path).free
    assert min_dataset_bytes(TINY.model, data) > free      # 16 TB: no test machine has that free
    with pytest.raises(UsageError, match="rows need at least .* GB"):
        generate_dataset(TINY.model, data, tmp_path / "d")
    assert not (tmp_path / "d").exists()
    line = cli("data", "generate", "--set", "n_train=1000000000000", "--out", str(tmp_path / "d"))
    assert "1,000,000,004,096 rows need at least 16,000.0 GB" in line
    # the bound is a lower bound: the tiny preset's real shards are larger than it says
    assert min_dataset_bytes(TINY.model, TINY.data) == (24_576 + 4096) * 8 * 2


def test_dataloader_workers_are_bounded_by_the_machine(cli):
    import os

    limit = RANKS_PER_CPU * (os.cpu_count() or 1)
    check_workers(limit)
    with pytest.raises(UsageError, match=f"--num-workers {limit + 1}: at most {limit}"):
        check_workers(limit + 1)
    assert f"at most {limit} DataLoader worker processes" in cli("train", "--num-workers", str(limit + 1))


@pytest.mark.parametrize("args, message", [
    (["--balance", "kk"], "--balance kk splits each global batch across ranks: add --ranks N"),
    (["--sparse-sharding", "row"], "--sparse-sharding row shards the embedding tables across ranks: add --ranks N"),
])
def test_multi_rank_switches_in_one_process_are_refused(cli, args, message):
    assert message in cli("train", "--steps", "1", *args)


# ----------------------------------------------------------------------------- 9. choices that cannot run here


@pytest.mark.parametrize("args, message", [
    (["--jagged", "--kernel", "triton"], "gdpa kernel 'triton' cannot run here"),
    (["--jagged", "--kernel", "flash_attn"], "gdpa kernel 'flash_attn' cannot run here"),
    (["--precision", "mxfp8", "--precision-kernel", "native"], "kernel='native' for mxfp8"),
])
def test_a_kernel_that_cannot_run_here_is_the_user_s_choice(data_root, cli, args, message, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("these kernels may run on this machine's GPU; the refusal is what a CPU-only machine shows")
    assert message in cli("train", "--steps", "1", "--warmup-steps", "0", "--quiet", "--device", "cpu", *args)


def test_a_notebook_that_refuses_a_parameter_exits_2(tmp_path, capsys):
    code = main(["notebooks", "run", "00_mfu_baseline", "--out", str(tmp_path), "--param", "PRESET=nope"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]        # a progress line ([1/1] name) may come before it
    assert "notebook 00_mfu_baseline" in last and "unknown preset 'nope'" in last


# ----------------------------------------------------------------------------- 6. gdpa misuse


@pytest.mark.parametrize("kwargs, message", [
    (dict(qk_scale="x"), "qk_scale must be a finite number or None, got 'x'"),
    (dict(qk_scale=float("nan")), "qk_scale must be a finite number or None, got nan"),
    (dict(qk_scale=True), "qk_scale must be a finite number or None, got True"),
    (dict(out_scale=None), "out_scale must be a finite number, got None"),
    (dict(out_scale=float("inf")), "out_scale must be a finite number, got inf"),
    (dict(max_len=-1), "max_len must be None or an int >= 0"),
    (dict(max_len=2.0), "max_len must be None or an int >= 0"),
    (dict(max_len=5), r"max_len=5 is shorter than the longest sequence \(6\)"),
    (dict(kv_max_len=3), r"kv_max_len=3 is shorter than the longest sequence \(6\)"),
])
def test_gdpa_checks_scales_and_length_hints(kwargs, message):
    q = torch.randn(10, 2, 8)
    offsets = torch.tensor([0, 4, 10])
    with pytest.raises(ValueError, match=message):
        gdpa(q, q, q, offsets, kernel="reference", **kwargs)
    exact = gdpa(q, q, q, offsets, kernel="reference", max_len=6)       # an exact hint is fine
    assert torch.equal(exact, gdpa(q, q, q, offsets, kernel="reference"))


# ----------------------------------------------------------------------------- 8/10. environment, divergence


def test_a_bad_torchrun_world_size_is_one_line(monkeypatch, cli):
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "localhost"), ("MASTER_PORT", "1"),
                        ("WORLD_SIZE", "abc")):
        monkeypatch.setenv(name, value)
    assert "WORLD_SIZE='abc' (torchrun's environment) must be an integer >= 1" in cli("train", "--steps", "1")


def test_a_diverging_run_is_one_line_naming_the_step(data_root, capsys):
    code = main(["train", "--steps", "3", "--warmup-steps", "0", "--eval-batches", "1", "--quiet", "--lr", "1e30"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    line, = err.strip().splitlines()
    assert line.startswith("gemref train: error: training step ") and "non-finite loss" in line


def test_fewer_steps_than_warmup_times_what_it_can_and_says_so(data_root, caplog):
    """warmup_steps=5 on a 2-step run: one warm-up step, one timed, a warning naming both
    (never a silent clamp), and the record states the warm-up it used."""
    from gemref.measure.run import run

    train = override(TINY.train, steps=2, warmup_steps=5, eval_every=0)
    with caplog.at_level("WARNING", logger="gemref.train"):
        record = run("tiny", train, device="cpu", data_root=data_root, progress=False, measure_memory=False)
    assert record["warmup_steps"] == 1 and record["steps_timed"] == 1
    assert any("not warmup_steps=5" in r.getMessage() for r in caplog.records)
