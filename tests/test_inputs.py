"""Bad input is a one-line error (exit 2) before any work, never a traceback or a silent success.

By class: typed values (1), output paths (2), files the user names (3), rank limits
(8), user errors vs bugs in notebook parameters (9). Each class through the real CLI
(subprocess) and through the API.
"""
import json
import math
import re
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest

from gemref.cli import main
from gemref.options import (MAX_RANKS_ENV, RANKS_PER_CPU, check_local_ranks, check_output_dir,
                                  check_output_file, max_local_ranks)
from gemref.data.config import DataConfig
from gemref.model.config import ModelConfig
from gemref.train.config import TrainConfig
from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.errors import UsageError, user_input
from gemref.commands.switches import parse_switch
from gemref.config.values import has_type, parse_field
from gemref.walkthrough.params import check_params, declared_parameters, parse_param
from gemref.walkthrough.batch import run_notebooks
from gemref.walkthrough.params import NOTEBOOK_DIR, expand_grid, load_grid, load_profile

TINY = get_preset("tiny")


def gemref(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gemref", *args], capture_output=True, text=True,
                          env=None if env is None else {**os.environ, **env}, timeout=300)


def error_line(r: subprocess.CompletedProcess) -> str:
    """The one stderr line of a run that exited 2 without doing anything."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == "", r.stdout
    return lines[0]


@pytest.fixture
def cli(capsys):
    """`gemref ARGS` in this process (the parametrized cases; each class also has a subprocess test)."""
    def run(*args):
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)
    return run


# ----------------------------------------------------------------------------- 1. typed values


@pytest.mark.parametrize("args, message", [
    (["train", "--set", "lr=abc"], "TrainConfig.lr expects a finite number, got 'abc'"),
    (["train", "--set", "steps=1.5"], "TrainConfig.steps expects an integer, got '1.5'"),
    (["data", "generate", "--set", "n_train=abc"], "DataConfig.n_train expects an integer, got 'abc'"),
    (["train", "--set", "lr=[1,"], "TrainConfig.lr expects a finite number, got '[1,'"),
    (["train", "--set", "jagged=maybe"], "jagged expects a boolean (true/false, 1/0, yes/no), got 'maybe'"),
    (["train", "--lr", "nan"], "argument --lr: expected a finite number, got 'nan'"),
    (["train", "--set", "kernel=fastest"], "--set kernel=fastest: valid: auto, reference"),
    (["data", "generate", "--set", "zipf_a=-3"], "DataConfig.zipf_a must be > 0, got -3.0"),
    (["data", "generate", "--set", "median_len=100"], "median_len=100 exceeds the tiny preset's max_len=64"),
    (["train", "--batch-size", "100000"], "batch_size=100000 exceeds the tiny preset's n_train=24576"),
    (["flops", "--batch-size", "0"], "TrainConfig.batch_size must be >= 1, got 0"),
])
def test_values_are_parsed_by_the_field_type(cli, args, message):
    assert message in error_line(cli(*args))


def test_typed_values_through_the_real_cli():
    assert "jagged expects a boolean" in error_line(gemref("train", "--set", "jagged=maybe"))
    assert "DataConfig.n_train expects an integer" in error_line(gemref("data", "generate", "--set", "n_train=abc"))


@pytest.mark.parametrize("name, text, value", [
    ("lr", "1e-3", 1e-3), ("lr", "2", 2.0), ("steps", " 12 ", 12), ("jagged", "YES", True), ("jagged", "0", False),
    ("mesh", "2x2", "2x2"), ("ac_budget", "0.5", 0.5), ("kernel", "auto", "auto"),
])
def test_parse_switch_accepts(name, text, value):
    parsed = parse_switch(name, text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("name, text, message", [
    ("steps", "1.5", "TrainConfig.steps expects an integer"), ("steps", "1e3", "TrainConfig.steps expects"),
    ("steps", "true", "TrainConfig.steps expects"), ("lr", "inf", "TrainConfig.lr expects a finite number"),
    ("lr", "", "TrainConfig.lr expects"), ("jagged", "maybe", "jagged expects a boolean"),
    ("jagged", "2", "jagged expects a boolean"), ("ac_budget", "half", "ac_budget expects a finite number"),
    ("kernel", "fastest", "--set kernel=fastest: valid: auto, reference"), ("foo", "1", "unknown TrainConfig field 'foo'"),
])
def test_parse_switch_rejects_naming_the_switch_and_type(name, text, message):
    with pytest.raises(UsageError, match="^" + re.escape(message)):
        parse_switch(name, text)


@pytest.mark.parametrize("cls, name, text, value", [
    (ModelConfig, "sparse_vocab", "[8, 64]", (8, 64)), (ModelConfig, "sparse_vocab", "8,64", (8, 64)),
    (ModelConfig, "sparse_vocab", "(5,)", (5,)),
])
def test_parse_field_accepts(cls, name, text, value):
    parsed = parse_field(cls, name, text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("cls, name, text", [
    (TrainConfig, "steps", "1.5"), (TrainConfig, "lr", "inf"), (ModelConfig, "sparse_vocab", "[1,"), (ModelConfig, "sparse_vocab", "[1, x]"),
    (ModelConfig, "sparse_vocab", "[1, 2)"),
])
def test_parse_field_rejects_naming_field_and_type(cls, name, text):
    with pytest.raises(UsageError, match=rf"^{cls.__name__}\.{name} expects .*, got "):
        parse_field(cls, name, text)


def test_has_type_keeps_bools_out_of_numbers():
    assert has_type(3, float) and has_type(3, int) and not has_type(True, int) and not has_type(True, float)
    assert not has_type(math.nan, float) and not has_type((1, 2.0), tuple[int, ...])


@pytest.mark.parametrize("cfg, change, message", [
    (TINY.train, {"jagged": "maybe"}, "^jagged expects a boolean"),
    (TINY.train, {"steps": 2.0}, "TrainConfig.steps expects an integer"),
    (TINY.train, {"lr": math.nan}, "TrainConfig.lr expects a finite number"),
    (TINY.train, {"lr": 0.0}, "TrainConfig.lr must be > 0"),
    (TINY.train, {"weight_decay": -0.1}, "weight_decay must be >= 0"),
    (TINY.train, {"seed": -1}, "TrainConfig.seed must be in .0, 2..63 - 1., got -1"),
    (TINY.data, {"zipf_a": -3.0}, "DataConfig.zipf_a must be > 0"),
    (TINY.data, {"len_sigma": 0.0}, "DataConfig.len_sigma must be > 0"),
    (TINY.data, {"pos_rate": 1.0}, "pos_rate must be in (0, 1)"),
    (TINY.data, {"seed": -1}, "DataConfig.seed must be in .0, 2..63 - 1., got -1"),
    (TINY.data, {"n_eval": 0}, "DataConfig.n_eval must be >= 1"),
    (TINY.model, {"n_heads": 0}, "ModelConfig.n_heads must be >= 1"),
    (TINY.model, {"sparse_vocab": [50, 200]}, "ModelConfig.sparse_vocab expects a list of integers"),
    # options that would be ignored are refused, not dropped
    (TINY.train, {"kernel": "auto"}, "kernel='auto' runs on the jagged layout: add jagged"),
    (TINY.train, {"ac_budget": 0.5}, "ac_budget=0.5 is read only by ac 'auto' and 'memory_budget', not ac='none'"),
    (TINY.train, {"ac": "full", "ac_plan": "sequence:FF interaction:-- cross:--"}, "ac_plan is AutoAC's solved plan: it needs ac 'auto'"),
    (TINY.train, {"ac": "auto", "ac_plan": "sequence:FF"}, "ac_plan='sequence:FF' must look like"),
    (TINY.train, {"ac": "auto", "ac_plan": "sequence:CF interaction:-- cross:--"}, "ac_plan compresses blocks (C): set ac_compress"),
])
def test_config_dataclasses_check_types_and_ranges(cfg, change, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        override(cfg, **change)


def test_preset_checks_data_against_the_model():
    with pytest.raises(UsageError, match="median_len=65 exceeds the tiny preset's max_len=64"):
        replace(TINY, data=override(TINY.data, median_len=65))
    assert replace(TINY, data=override(TINY.data, median_len=64)).data.median_len == 64


def test_notebook_param_values_are_typed_by_the_declared_default():
    assert parse_param("STEPS", "20", 30) == 20
    assert parse_param("MFU", "0.5", 0.35) == 0.5 and parse_param("PT2", "no", True) is False
    assert parse_param("PRESET", "small", "tiny") == "small"
    assert parse_param("RANKS", "[8, 64, 1024]", [8, 64]) == [8, 64, 1024]
    assert parse_param("BUDGETS", "[1, 0.5]", [1.0, 0.5]) == [1, 0.5]
    assert parse_param("BATCH_SIZE", "None", None) is None and parse_param("BATCH_SIZE", "64", None) == 64
    assert parse_param("BATCH_PER_GPU", "null", 128) is None and parse_param("PRESET", "None", "tiny") == "None"
    for name, text, default, message in [("STEPS", "abc", 30, "--param STEPS expects an integer"),
                                         ("RANKS", "[8, x]", [8, 64], "--param RANKS expects a list of int"),
                                         ("RANKS", "[8,", [8, 64], "--param RANKS=\\[8,: not a value"),
                                         ("PT2", "maybe", True, "--param PT2 expects a boolean")]:
        with pytest.raises(UsageError, match=message):
            parse_param(name, text, default)
    with pytest.raises(UsageError, match=r"nb: parameter STEPS='x' should be an integer \(its default is 30\)"):
        check_params("nb", {"STEPS": "x"}, {"STEPS": 30})


def test_notebook_params_through_the_cli():
    assert "--param STEPS expects an integer, got 'abc'" in error_line(
        gemref("notebooks", "run", "00_mfu_baseline", "--param", "STEPS=abc"))


# ----------------------------------------------------------------------------- 2. output paths


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("x")
    return path


@pytest.mark.parametrize("args, message", [
    (["train", "--json", "/proc/gemref-run.json"], "argument --json: /proc/gemref-run.json: /proc is not writable"),
    (["train", "--json", "{tmp}"], "argument --json: {tmp}: is a directory; give a file path"),
    (["train", "--json", "{file}/run.json"], "argument --json: {file}/run.json: {file} is a file, so nothing"),
    (["train", "--out", "/proc/gemref-out"], "argument --out: /proc/gemref-out: /proc is not writable"),
    (["train", "--checkpoint-dir", "{file}"], "argument --checkpoint-dir: {file}: is a file, not a folder"),
    (["data", "generate", "--out", "/proc/gemref-data"], "argument --out: /proc/gemref-data: /proc is not writable"),
    (["flops", "--json", "{file}/x/y.json"], "{file} is a file, so nothing can be created under it"),
    (["bench", "compile", "--json", "{tmp}"], "is a directory"),
    (["simulate", "project", "--json", "/proc/sim.json"], "/proc is not writable"),
    (["waterfall", "--out", "{file}"], "is a file, not a folder"),
])
def test_output_paths_are_checked_before_any_work(cli, args, message, tmp_path, a_file):
    args = [a.format(tmp=tmp_path, file=a_file) for a in args]
    assert message.format(tmp=tmp_path, file=a_file) in error_line(cli(*args))


def test_output_paths_through_the_real_cli(tmp_path, a_file):
    assert "/proc is not writable" in error_line(gemref("train", "--json", "/proc/gemref-run.json"))
    assert "is a file, not a folder" in error_line(gemref("train", "--checkpoint-dir", str(a_file)))
    assert "/proc is not writable" in error_line(gemref("data", "generate", "--out", "/proc/gemref-data"))


def test_output_path_checks_accept_new_paths_and_leave_nothing_behind(tmp_path, a_file):
    assert check_output_file(str(tmp_path / "new" / "deeper" / "r.json")) == str(tmp_path / "new" / "deeper" / "r.json")
    assert check_output_file(str(a_file)) == str(a_file)              # replaced atomically
    assert check_output_dir(str(tmp_path / "run")) == str(tmp_path / "run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]
    with pytest.raises(UsageError, match="--out .*a_file: is a file, not a folder"):
        check_output_dir(str(a_file), "--out")


def test_an_unwritable_folder_is_refused(tmp_path):
    if os.geteuid() == 0:
        folder = Path("/proc/self")          # root may write anywhere else; not here
    else:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o555)
    with pytest.raises(UsageError, match="is not writable"):
        check_output_file(str(folder / "r.json"))


# ----------------------------------------------------------------------------- 3. files the user names


def test_grid_file_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "grid.yaml"
    bad.write_text("PRESET: [tiny, small]\nSTEPS: [3\nWARMUP: [1]\n")
    line = error_line(gemref("notebooks", "run", "10_waterfall", "--grid", str(bad)))
    assert f"--grid {bad}: line 3, column 7: invalid YAML:" in line
    assert f"--grid {tmp_path / 'nope.yaml'}: no such file" in error_line(
        gemref("notebooks", "run", "--grid", str(tmp_path / "nope.yaml")))


@pytest.mark.parametrize("text, message", [
    ("- 1\n- 2\n", "a grid is a mapping of parameter -> list of values"),
    ("STEPS: 3\n", "grid entry 'STEPS' must be a non-empty list"),
])
def test_grid_shape_errors(tmp_path, text, message):
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        expand_grid(load_grid(path))
    with pytest.raises(UsageError, match="is a directory|cannot read it"):
        load_grid(tmp_path)


def _toy_notebooks(folder: Path, params_source: str, profile: str = "global: {}\n") -> Path:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(params_source)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell("raise RuntimeError('must not run')")]
    (folder / "params").mkdir(parents=True)
    (folder / "params" / "ci.yaml").write_text(profile)
    nbformat.write(nb, folder / "00_toy.ipynb")
    return folder


def test_profile_yaml_errors_and_types_are_checked_before_any_notebook_runs(tmp_path):
    folder = _toy_notebooks(tmp_path / "a", "STEPS = 3  # steps (>= 1)\nRANKS = [2, 4]  # a = b\n")
    with pytest.raises(UsageError, match=r"00_toy: parameter STEPS='many' should be an integer"):
        run_notebooks("ci", tmp_path / "out", notebook_dir=folder, grid={"STEPS": [2, "many"]}, log=print)
    with pytest.raises(UsageError, match=r"RANKS=\[2, 2.5\] should be a list of int"):
        run_notebooks("ci", tmp_path / "out", notebook_dir=folder, params={"RANKS": [2, 2.5]}, log=print)
    assert not (tmp_path / "out").exists()
    broken = _toy_notebooks(tmp_path / "b", "X = 1\n", profile="global:\n  X: [1\n")
    with pytest.raises(UsageError, match=r"profile .*ci.yaml: line 3, column 1: invalid YAML"):
        load_profile("ci", broken / "params")


def test_parameters_cell_is_read_whole():
    """papermill's reader drops lines with two '=' (e.g. '>= 3' in a comment); ours keeps them."""
    declared = declared_parameters(NOTEBOOK_DIR / "10_waterfall.ipynb")
    assert {"RANKS", "WINDOWS", "SKIP"} <= set(declared) and declared["WINDOWS"] == 3


def test_notebook_parameter_errors_are_one_line_without_papermill_warnings():
    r = gemref("notebooks", "run", "10_waterfall", "--param", "RANKS=two")
    assert "--param RANKS expects an integer, got 'two'" in error_line(r)
    r = gemref("notebooks", "run", "10_waterfall", "--param", "BOGUS=1")
    assert "unknown parameter 'BOGUS'; the selected notebooks declare" in error_line(r)


# ----------------------------------------------------------------------------- 8. limits


def test_ranks_are_checked_against_the_machine_in_the_user_s_terms():
    line = error_line(gemref("train", "--ranks", "100000"))
    assert f"--ranks 100000: at most {RANKS_PER_CPU * os.cpu_count()} local cpu ranks here" in line
    assert f"set {MAX_RANKS_ENV}=N" in line
    assert "argument --ranks: expected an integer >= 1, got '0'" in error_line(gemref("train", "--ranks", "0"))
    assert "mesh=1x3 needs R*S = 3 ranks, but the world size is 2" in error_line(gemref("train", "--ranks", "2", "--mesh", "1x3"))
    assert "--batch-size 1 is the global batch: --ranks 2 needs at least one sample per rank" in error_line(
        gemref("train", "--ranks", "2", "--batch-size", "1"))
    assert "--ranks 100000: at most 3" in error_line(gemref("waterfall", "--ranks", "100000",
                                                            env={MAX_RANKS_ENV: "3"}))
    assert "--ranks 9: at most 8" in error_line(gemref("simulate", "validate", "--ranks", "2", "9",
                                                       env={MAX_RANKS_ENV: "8"}))


def test_rank_limit_override_and_cuda(monkeypatch):
    monkeypatch.setenv(MAX_RANKS_ENV, "100000")
    check_local_ranks(100000, "cpu")
    monkeypatch.setenv(MAX_RANKS_ENV, "lots")
    with pytest.raises(UsageError, match=f"{MAX_RANKS_ENV}='lots'; valid: an integer >= 1"):
        max_local_ranks("cpu")
    import torch
    gpus = torch.cuda.device_count()
    with pytest.raises(UsageError, match=f"at most {gpus} local cuda ranks here \\(one rank per GPU and this host "
                                         f"has {gpus}; use torchrun"):
        check_local_ranks(gpus + 1, "cuda")


# ----------------------------------------------------------------------------- 9. user errors vs bugs


def test_user_input_marks_only_value_errors_as_the_user_s():
    with pytest.raises(UsageError, match="bad flag") as e:
        with user_input():
            raise ValueError("bad flag")
    assert isinstance(e.value.__cause__, ValueError)
    with pytest.raises(KeyError):
        with user_input():
            raise KeyError("a bug")


def test_config_errors_are_usage_errors_and_still_value_errors():
    with pytest.raises(UsageError):
        get_preset("huge")
    with pytest.raises(ValueError, match="unknown TrainConfig field"):
        override(TINY.train, foo=1)
    assert issubclass(UsageError, ValueError)
    assert DataConfig(n_train=1, n_eval=1).zipf_a > 0


def test_a_bad_launch_is_a_usage_error_before_any_rank_starts(data_root):
    from gemref.measure.run import launch_runs

    with pytest.raises(UsageError, match=r"mesh=2x2 needs R\*S = 4 ranks, but the world size is 3"):
        launch_runs(TINY, [override(TINY.train, mesh="2x2")], ranks=3, device="cpu")
    with pytest.raises(UsageError, match="backend 'nccl' needs --device cuda"):
        launch_runs(TINY, [override(TINY.train, mesh="1x2", backend="nccl")], ranks=2, device="cpu")


def test_json_record_of_a_command_is_written_only_when_the_path_is_good(tmp_path):
    r = gemref("simulate", "project", "--preset", "tiny", "--gpus", "8", "--batches", "1",
               "--json", str(tmp_path / "sim.json"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "sim.json").read_text())["kind"] == "simulate"


@pytest.mark.parametrize("profile", ["ci", "cpu", "gpu"])
def test_every_profile_fits_the_notebooks_declared_types(profile):
    from gemref.walkthrough.params import profile_params, select_notebooks

    for nb in select_notebooks(None):
        check_params(nb.stem, profile_params(profile, nb.stem), declared_parameters(nb))
