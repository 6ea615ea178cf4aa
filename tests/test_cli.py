"""The `gemref` command: its structure and conventions, user errors vs bugs, and tiny real runs.

Bad-input classes (typed values, output paths, files, ranks) are in tests/test_inputs.py.
"""
import argparse
import json
import subprocess
import sys
import textwrap

import pytest

from gemref import cli
from gemref.cli import build_parser, main
from gemref.train.presets import get_preset
from gemref.train.config import switch_names
from gemref.errors import UsageError


def gemref(*args, env=None):
    return subprocess.run([sys.executable, "-m", "gemref", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def all_parsers(parser=None, path=("gemref",)):
    """(path, parser) for every parser and sub-parser, each configured."""
    parser = (parser or build_parser()).configured()
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from all_parsers(sub, path + (name,))


def options(parser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings}


# ----------------------------------------------------------------------------- conventions


def test_every_device_option_is_auto_cpu_cuda_with_default_auto():
    found = [(path, options(p)["--device"]) for path, p in all_parsers() if "--device" in options(p)]
    assert {" ".join(path) for path, _ in found} >= {"gemref train", "gemref flops", "gemref waterfall",
                                                      "gemref bench attention", "gemref bench autoac",
                                                      "gemref bench compile", "gemref bench precision"}
    for path, action in found:
        assert tuple(action.choices) == ("auto", "cpu", "cuda") and action.default == "auto", path


def test_steps_means_the_optimisation_steps_of_a_training_run_only():
    with_steps = {" ".join(path): options(p)["--steps"] for path, p in all_parsers() if "--steps" in options(p)}
    assert set(with_steps) == {"gemref train", "gemref flops"}
    assert all(a.dest == "steps" for a in with_steps.values())          # TrainConfig.steps
    per = {o for _, p in all_parsers() for o in options(p) if o.startswith("--steps-per-")}
    assert per == {"--steps-per-window", "--steps-per-strategy", "--steps-per-variant", "--steps-per-precision",
                   "--steps-per-policy", "--steps-per-run", "--steps-per-seed"}


FLAT_SWITCHES = (
    "batch_size", "steps", "lr", "weight_decay", "warmup_steps", "eval_every", "eval_batches", "seed", "num_workers",
    "jagged", "kernel", "compile", "compile_regions", "ac", "ac_budget", "ac_compress", "ac_plan", "balance", "mesh",
    "reshard_after_forward", "sparse_sharding", "backend", "table_optimizer", "table_sync_interval", "table_lr", "precision", "precision_kernel", "precision_min_dim",
    "embeddings", "torchrec_sharding", "torchrec_2d", "checkpoint_dir", "checkpoint_every", "resume",
    "checkpoint_overwrite")


def test_train_has_one_option_per_trainconfig_field():
    train = dict(all_parsers())[("gemref", "train")]
    opts = options(train)
    # the flags of the flat TrainConfig before it had sections (the sections kept every one), and the later ones
    assert switch_names() == FLAT_SWITCHES
    for name in switch_names():
        flag = "--" + name.replace("_", "-")
        assert opts[flag].dest == name and opts[flag].default is None and opts[flag].help, name
    args = train.parse_args(["--lr", "0.01", "--no-reshard-after-forward", "--jagged", "--set", "seed=3"])
    from gemref.commands.switches import train_config_from_args
    cfg = train_config_from_args(args, get_preset("tiny").train)
    assert (cfg.lr, cfg.parallelism.reshard_after_forward, cfg.attention.jagged, cfg.seed) == (0.01, False, True, 3)
    assert cfg.steps == get_preset("tiny").train.steps                # not given: the preset's


def test_simulate_has_project_validate_and_published_actions(tmp_path):
    r = gemref("simulate", "--validate")
    assert r.returncode == 2 and "required: ACTION (choose from project, validate, published)" in one_line(r.stderr)
    sim = dict(all_parsers())
    assert all(("gemref", "simulate", a) in sim for a in ("project", "validate", "published"))
    r = gemref("simulate", "published", "--json", str(tmp_path / "p.json"))
    assert r.returncode == 0 and "torchtitan" in r.stdout
    saved = json.loads((tmp_path / "p.json").read_text())
    assert len(saved["bus_bandwidth"]) == 4 and len(saved["fsdp_scaling"]) == 3


def test_abbreviated_options_are_refused_with_the_full_name():
    assert "did you mean --steps-per-window?" in one_line(gemref("waterfall", "--steps", "3").stderr)


def test_unknown_switch_exits_2_with_one_line():
    r = gemref("train", "--jaged")
    assert r.returncode == 2 and "--jaged (did you mean --jagged?)" in one_line(r.stderr)


def test_help_imports_no_bench_module_and_no_torch():
    code = textwrap.dedent("""
        import sys
        from gemref.cli import main
        assert main(["--help"]) == 0
        assert main(["bench", "--help"]) == 0
        print("imported:", sorted(m for m in sys.modules if m.startswith(("torch", "gemref.bench."))))
        assert main(["bench", "attention", "--help"]) == 0
        print("imported:", sorted(m for m in sys.modules if m.startswith("gemref.bench.")))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    before, after = [line for line in r.stdout.splitlines() if line.startswith("imported:")]
    assert before == "imported: []"
    assert after == "imported: ['gemref.bench.attention']"


def test_registering_a_command_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "hello_cmd.py").write_text(textwrap.dedent("""
        NAME = "hello"
        HELP = "say hello"
        def configure(p):
            p.add_argument("--name", default="world")
            p.set_defaults(func=lambda args: print(f"hello {args.name}") or 0)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "COMMANDS", cli.COMMANDS + ("hello_cmd",))
    assert main(["hello", "--name", "gem"]) == 0
    assert capsys.readouterr().out == "hello gem\n"


# ----------------------------------------------------------------------------- user errors vs bugs


@pytest.mark.parametrize("args, message", [
    (["train", "--steps", "0"], "steps must be >= 1"),
    (["train", "--set", "foo=1"], "unknown TrainConfig field 'foo'; valid:"),
    (["train", "--set", "lr"], "--set expects key=value"),
    (["train", "--lr", "0.1", "--set", "lr=0.2"], "lr given both as --lr and by --set"),
    (["train", "--preset", "huge"], "invalid choice: 'huge'"),
    (["notebooks", "run", "--profile", "nope"], "unknown profile 'nope'; valid: ci"),
])
def test_user_mistakes_exit_2_with_one_line(capsys, args, message):
    assert main(args) == 2
    assert message in one_line(capsys.readouterr().err)


def test_a_usage_error_is_one_line_but_an_internal_value_error_keeps_its_traceback(tmp_path):
    code = textwrap.dedent("""
        import sys
        import gemref.commands.flops as flops
        from gemref.errors import UsageError
        def broken(args):
            raise {0}("an internal inconsistency")
        flops.run = broken
        from gemref.cli import main
        sys.exit(main(["flops"]))
    """)
    bug = subprocess.run([sys.executable, "-c", code.format("ValueError")], capture_output=True, text=True)
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "in broken" in bug.stderr
    mistake = subprocess.run([sys.executable, "-c", code.format("UsageError")], capture_output=True, text=True)
    assert mistake.returncode == 2
    assert one_line(mistake.stderr) == "gemref flops: error: an internal inconsistency"


def test_main_returns_2_for_usage_errors_and_raises_other_errors(monkeypatch):
    import gemref.commands.flops as flops

    def raising(error):
        def run(args):
            raise error
        return run

    monkeypatch.setattr(flops, "run", raising(KeyError("bug")))
    with pytest.raises(KeyError):
        main(["flops"])
    monkeypatch.setattr(flops, "run", raising(UsageError("yours")))
    assert main(["flops"]) == 2


@pytest.mark.multiproc
def test_a_rank_s_usage_error_stays_one(tmp_path):
    from gemref.parallel.launch import spawn

    with pytest.raises(UsageError, match="^rank input was wrong$"):
        spawn(_raise_in_rank, 1, ("UsageError",), timeout_s=120)
    with pytest.raises(ValueError, match="(?s)rank 0: a bug.*Traceback.*_raise_in_rank") as bug:
        spawn(_raise_in_rank, 1, ("ValueError",), timeout_s=120)
    assert not isinstance(bug.value, UsageError)


def _raise_in_rank(rank, world, kind):
    from gemref.errors import UsageError
    raise UsageError("rank input was wrong") if kind == "UsageError" else ValueError("a bug")


# ----------------------------------------------------------------------------- tiny real runs


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


def test_data_flag_picks_the_data_folder_and_the_config_s_own_subfolder(tmp_path):
    from gemref.train.override import override
    from gemref.data.shards import dataset_dir

    r = gemref("--data", str(tmp_path), "data", "generate", "--preset", "tiny", "--quiet",
               "--set", "n_train=200", "--set", "n_eval=50", "--set", "seed=7")
    assert r.returncode == 0, r.stderr
    tiny = get_preset("tiny")
    expected = dataset_dir("tiny", tiny.model, override(tiny.data, n_train=200, n_eval=50, seed=7), tmp_path)
    assert json.loads((expected / "manifest.json").read_text())["data"]["seed"] == 7
    assert [p.name for p in tmp_path.iterdir()] == [expected.name]


def test_data_flag_sets_the_variable_only_while_the_command_runs(tmp_path, monkeypatch):
    import os

    import gemref.commands.flops as flops

    monkeypatch.setenv("GEMREF_DATA_DIR", "/somewhere/else")
    seen = []
    monkeypatch.setattr(flops, "run", lambda args: seen.append(os.environ["GEMREF_DATA_DIR"]) or 0)
    assert main(["flops", "--data", str(tmp_path)]) == 0
    assert seen == [str(tmp_path)] and os.environ["GEMREF_DATA_DIR"] == "/somewhere/else"
    file = tmp_path / "a_file"
    file.write_text("x")
    assert main(["--data", str(file), "flops"]) == 2


def test_train_writes_record_and_figure(data_root, tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--steps", "5", "--device", "cpu", "--quiet",
                 "--out", str(tmp_path), "--set", "eval_batches=1", "--set", "warmup_steps=1"]) == 0
    out = capsys.readouterr().out
    assert "mfu" in out and "measured" in out
    assert json.loads((tmp_path / "run.json").read_text())["steps_timed"] == 4
    assert "plotly" in (tmp_path / "run.html").read_text()


def test_train_typed_switches_reach_the_record_through_the_real_cli(data_root, tmp_path):
    r = gemref("train", "--preset", "tiny", "--steps", "2", "--device", "cpu", "--quiet", "--json",
               str(tmp_path / "run.json"), "--set", "jagged=yes", "--eval-batches", "1", "--warmup-steps", "1")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "run.json").read_text())["config"]["train"]["attention"]["jagged"] is True
