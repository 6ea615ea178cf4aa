"""The `gemref` command: tables on stdout, exit 2 with one clear line for user mistakes."""
import json
import subprocess
import sys

import pytest

from gemref.cli import main


def gemref(*args):
    return subprocess.run([sys.executable, "-m", "gemref", *args], capture_output=True, text=True)


def test_unknown_preset_lists_valid_names():
    r = gemref("train", "--preset", "huge")
    assert r.returncode == 2
    assert "tiny" in r.stderr and "small" in r.stderr and "Traceback" not in r.stderr


def test_unknown_switch_exits_2():
    r = gemref("train", "--turbo")
    assert r.returncode == 2 and "--jagged" in r.stderr      # usage lists the valid switches


@pytest.mark.parametrize("args, message", [
    (["train", "--steps", "0"], "steps must be >= 1"),
    (["train", "--steps", "-3"], "steps must be >= 1"),
    (["train", "--set", "foo=1"], "unknown TrainConfig field(s) ['foo']; valid:"),
    (["train", "--set", "lr"], "--set expects key=value"),
    (["notebooks", "run", "--profile", "nope"], "unknown profile 'nope'; valid: ci"),
])
def test_user_mistakes_exit_2_with_one_line(capsys, args, message):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_flops_verify_passes(preset, data_root, tmp_path, capsys):
    assert main(["flops", "--preset", preset, "--verify", "--device", "cpu",
                 "--json", str(tmp_path / "f.json")]) == 0
    report = json.loads((tmp_path / "f.json").read_text())
    assert report["verified"] and report["relative_error"] <= 0.02
    assert "PASS" in capsys.readouterr().out


def test_data_generate_prints_a_table(tmp_path, capsys):
    assert main(["data", "generate", "--preset", "tiny", "--out", str(tmp_path), "--quiet",
                 "--set", "n_train=300", "--set", "n_eval=100"]) == 0
    out = capsys.readouterr().out
    assert "train" in out and "300" in out
    assert (tmp_path / "manifest.json").exists()


def test_train_writes_record_and_figure(data_root, tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--steps", "5", "--device", "cpu", "--quiet",
                 "--out", str(tmp_path), "--set", "eval_batches=1", "--set", "warmup_steps=1"]) == 0
    out = capsys.readouterr().out
    assert "mfu" in out and "measured" in out
    assert json.loads((tmp_path / "run.json").read_text())["steps_timed"] == 4
    assert "plotly" in (tmp_path / "run.html").read_text()
