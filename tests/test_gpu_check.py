"""The GPU check (scripts/gpu_check.sh, the package scripts/gpu_check/) on CPU: the whole
--dry-run end to end, the wheel step, and the process-group handling (timeouts kill
grandchildren, killed sections keep their finished items). The GPU run itself cannot happen
here; this keeps it from rotting. The check's variants, correctness items and winner rule are
gemref's; its driver code (scripts/gpu_check/children.py) is run the way the driver runs its
sections: in a Python started at the repository root."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from gemref.attention.testing import DRY_VARIANTS, VARIANTS, correctness_items, shard_items
from gemref.attention.triton.variant import choose_winner

ROOT = Path(__file__).resolve().parents[1]


def _children(expression: str, module: str = "children", setup: str = ""):
    """The JSON value of `expression`, evaluated with scripts/gpu_check/<module>.py imported as
    `<module>` (and os, Path), after the statements `setup`, in a Python started at the
    repository root."""
    code = f"import json, os\nfrom pathlib import Path\nfrom scripts.gpu_check import {module}\n{setup}\n" \
           f"print(json.dumps({expression}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _run_check(out: Path, wheel_dir: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "WHEEL_DIR": str(wheel_dir),
           "OMP_NUM_THREADS": "1"}
    env.pop("GEMREF_DATA_DIR", None)      # the check uses its own scratch data folder
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    return proc, json.loads((out / "gpu_check.json").read_text())


def test_dry_run_end_to_end(tmp_path):
    (tmp_path / "wheels").mkdir()
    proc, summary = _run_check(tmp_path / "out", tmp_path / "wheels", "--dry-run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu_check.json", "gpu_check.log"]
    assert summary["dry_run"] and summary["finished"]
    assert summary["environment"]["wheels"].startswith("missing")
    sections = summary["sections"]
    assert list(sections) == ["ceilings", "correctness", "timing", "rungs"]
    assert {name: s["status"] for name, s in sections.items()} == dict.fromkeys(sections, "ok")

    ceilings = sections["ceilings"]["result"]
    assert ceilings["gemm_bf16"]["tflops"] > 0 and ceilings["copy_d2d"]["gb_per_s"] > 0

    correctness = sections["correctness"]["result"]
    records = correctness["cases"] + correctness["determinism"]
    assert correctness["failed"] == 0 and correctness["passed"] == len(records) == len(correctness_items(dry_run=True))
    assert {r["variant"] for r in records} == set(VARIANTS)          # every variant ran somewhere
    assert all(max(r["errors"].values()) <= r["tolerance"] for r in records)
    assert {r["head_dim"] for r in records} == {16, 32}             # the dry run's section D and the others
    split = next(r for r in correctness["determinism"] if r["variant"] == "base")
    assert all(split["repeat"]["bitwise_equal"].values())

    rows = sections["timing"]["result"]["rows"]
    timed = {(r["activation"], r["kernel"]) for r in rows if "fwd_ms" in r}
    assert {(a, v) for a in ("silu", "softmax") for v in DRY_VARIANTS} | {("softmax", "sdpa (gemref kernel)")} <= timed
    for r in rows:
        if "fwd_ms" in r:
            assert r["fwd_ms"] > 0 and r["bwd_ms"] > 0 and r["fwd_model_tflops"] > 0
            assert r["bwd_executed_tflops"] >= r["bwd_model_tflops"] or "ceiling" in r

    assert ceilings["tf32"]["cuda_matmul_allow_tf32"] in (True, False) and "triton_gdpa_fp32_dot" in ceilings["tf32"]
    assert set(ceilings["precision_support"]) == {"float8_rowwise", "float8_tensorwise", "mxfp8"}
    assert all(not s["native"] and s["reason"] for s in ceilings["precision_support"].values())   # a CPU

    result = sections["rungs"]["result"]
    rungs = result["rungs"]
    assert [r["rung"] for r in rungs] == ["0 baseline", "1 + jagged", "2 + flash/GDPA",
                                          "2 + flash/GDPA + float8 row-wise (same batch)", "3 + compile (every region)"]
    assert all(r["status"] == "ran" for r in rungs)
    assert rungs[3]["resolved"]["precision"] == "float8_rowwise" and rungs[3]["dtype"] == "float8_rowwise (emulated)"
    assert rungs[3]["batch_size"] == rungs[4]["batch_size"] == rungs[2]["batch_size"]
    assert all(r["batches_tried"] == [r["batch_size"]] and r["activation_bytes_per_sample"] > 0 for r in rungs)
    assert rungs[0]["activation_bytes_per_sample"] > rungs[1]["activation_bytes_per_sample"] > \
        rungs[2]["activation_bytes_per_sample"]          # padded > jagged with padded scores > fused
    assert result["tf32"] == ceilings["tf32"]
    # A rung's MFU is None only when every window was contended (a shared machine): then the row says so.
    assert all((r["mfu"] or 0) > 0 or r["windows_kept"] == 0 for r in rungs)
    assert ("best rung: " in proc.stdout) is any(r["mfu"] for r in rungs)
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert all(f"===== {name}:" in log for name in sections)
    pick = summary["gdpa_default"]   # only base and all_flags are both checked and timed in the dry run
    assert pick["winner"] in DRY_VARIANTS and pick["spec"] == VARIANTS[pick["winner"]]
    assert {n for n, s in pick["scores"].items() if s["correct"] and s["timed"]} == set(DRY_VARIANTS)


def _wheel(path: Path, valid: bool) -> Path:
    """A minimal pure-Python wheel (or a corrupt file with a wheel's name)."""
    wheel = path / "gemref_probe-1.0-py3-none-any.whl"
    if not valid:
        wheel.write_bytes(b"not a zip")
        return wheel
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("gemref_probe/__init__.py", "VALUE = 1\n")
        z.writestr("gemref_probe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: gemref-probe\nVersion: 1.0\n")
        z.writestr("gemref_probe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("gemref_probe-1.0.dist-info/RECORD", "")
    return wheel


@pytest.mark.parametrize("valid", [True, False])
def test_wheels_install_into_a_scratch_folder_or_the_check_goes_on(tmp_path, valid):
    (tmp_path / "wheels").mkdir()
    _wheel(tmp_path / "wheels", valid)
    proc, summary = _run_check(tmp_path / "out", tmp_path / "wheels", "--dry-run", "--sections")
    assert proc.returncode == 0 and summary["finished"] and summary["sections"] == {}
    env = summary["environment"]
    if valid:
        assert env["wheels"] == "installed: gemref_probe-1.0-py3-none-any.whl"
        assert "gemref_probe" in env["wheel_site"]
    else:
        assert env["wheels"].startswith("failed to install") and env["wheel_site"] == []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.parametrize("leader_waits", [True, False])
def test_children_are_killed_as_a_group(tmp_path, leader_waits):
    """A timed-out child's background grandchild dies with it; so does one a child that
    exited normally left behind."""
    pid_file = tmp_path / "pid"
    script = f"sleep 300 & echo $! > {pid_file}" + ("; sleep 300" if leader_waits else "")
    start = time.monotonic()
    (result,) = _children(f"children.run_children([['bash', '-c', {script!r}]], [Path({str(tmp_path / 'log')!r})], "
                          "2.0, dict(os.environ))")
    assert time.monotonic() - start < 30
    assert result["status"].startswith("timeout") if leader_waits else result["status"] == "ok"
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_killed_section_keeps_its_finished_items(tmp_path):
    script = tmp_path / "slow_section.py"      # run as `python -m slow_section`, from PYTHONPATH
    script.write_text("import json, sys, time\n"
                      "path = sys.argv[sys.argv.index('--result') + 1]\n"
                      "open(path, 'w').write(json.dumps({'rows': [{'done': 1}]}))\n"
                      "print('first item done', flush=True)\n"
                      "time.sleep(300)\n")
    log = tmp_path / "log"
    record = _children(f"children.run_section(children.Section('slow', 'slow_section', budget_s=3, dry_budget_s=3), "
                       f"100.0, True, Path({str(tmp_path)!r}), Path({str(log)!r}), "
                       f"{{**os.environ, 'PYTHONPATH': {str(tmp_path)!r}}})")
    assert record["status"].startswith("timeout after 3 s") and record["result"] == {"rows": [{"done": 1}]}
    assert "first item done" in log.read_text()


def test_shards_split_the_items_and_results_merge():
    all_items = correctness_items(dry_run=False)
    for n in (1, 3, 8):
        parts = [shard_items(all_items, i, n) for i in range(n)]
        assert sorted(it["name"] for p in parts for it in p) == sorted(it["name"] for it in all_items)
    merged = _children('children.merge_shards([{"cases": [1], "passed": 2, "failed": 0, "note": "a"}, '
                       '{"cases": [2, 3], "passed": 1, "failed": 1, "note": "b"}])')
    assert merged == {"cases": [1, 2, 3], "passed": 3, "failed": 1, "note": "a"}


def test_the_correctness_items_cover_the_head_dims_and_the_models_cross_attention():
    """The tiles change with the head dim: D = 16, 64 and the section's 128 are each checked on
    the GPU (silu and softmax); the model's cross attention (a few queries per sample) too."""
    items = correctness_items(dry_run=False)
    dims = {(it["head_dim"] or 128, it["case"]["activation"]) for it in items}
    assert {(d, a) for d in (16, 64, 128) for a in ("silu", "softmax")} <= dims
    cross = [it for it in items if it["case"]["cross"]]
    assert cross and all(max(it["case"]["q_lens"]) <= 4 < max(it["case"]["kv_lens"]) for it in cross)
    assert {it["head_dim"] for it in correctness_items(dry_run=True)} == {None, 32}


def _summary(records: list[tuple[str, bool]], rows: list[tuple]) -> dict:
    """A summary with correctness records (variant, passed) and timing rows
    (kernel, profile, activation, fwd_ms, bwd_ms) or (kernel, profile, activation, error)."""
    timing = [{"kernel": r[0], "profile": r[1], "activation": r[2], "fwd_ms": r[3], "bwd_ms": r[4]}
              if len(r) == 5 else {"kernel": r[0], "profile": r[1], "activation": r[2], "error": r[3]} for r in rows]
    return {"sections": {"correctness": {"result": {"cases": [{"variant": v, "passed": p} for v, p in records]}},
                         "timing": {"result": {"rows": timing}}}}


def test_the_winner_rule_picks_the_fastest_correct_timed_variant():
    variants = {"base": "autotune=0", "fast": "autotune=0,silu_tanh", "wrong": "x", "broken": "y", "sdpa": "-"}
    rows = [("base", "fixed", "silu", 2.0, 6.0), ("base", "fixed", "softmax", 4.0, 4.0),
            ("fast", "fixed", "silu", 1.0, 3.0),                                  # silu only: ratio 0.5
            ("wrong", "fixed", "silu", 0.1, 0.1), ("wrong", "fixed", "softmax", 0.1, 0.1),
            ("broken", "fixed", "silu", 0.5, 0.5), ("broken", "fixed", "softmax", "OutOfResources"),
            ("sdpa", "fixed", "softmax", 0.01, 0.01)]                              # a ceiling, not a variant
    pick = choose_winner(_summary([("base", True), ("fast", True), ("wrong", False), ("broken", True)], rows),
                         {k: v for k, v in variants.items() if k != "sdpa"})
    assert (pick["winner"], pick["spec"]) == ("fast", "autotune=0,silu_tanh")
    assert pick["scores"]["fast"]["step_ratio"] == pytest.approx(0.5)          # (1 + 3) / (2 + 6)
    assert pick["scores"]["base"]["step_ratio"] == pytest.approx(1.0)
    assert not pick["scores"]["wrong"]["correct"] and not pick["scores"]["broken"]["timed"]
    # fwd alone: fast 1/2 = 0.5, base 1; bwd alone: fast 3/6 = 0.5
    assert pick["fwd_winner"] == pick["bwd_winner"] == "fast"
    # geometric mean over rows: 0.5 on silu, 2.0 on softmax -> 1.0, ties base; the first listed wins
    rows2 = rows[:2] + [("fast", "fixed", "silu", 1.0, 3.0), ("fast", "fixed", "softmax", 8.0, 8.0)]
    assert choose_winner(_summary([("base", True), ("fast", True)], rows2), variants)["scores"]["fast"]["step_ratio"] \
        == pytest.approx(1.0)
    # base failing a case disqualifies every variant (they are flags on the same kernel)
    none = choose_winner(_summary([("base", False), ("fast", True)], rows), variants)
    assert none["winner"] is None and "base failed" in none["reason"]
    assert choose_winner({"sections": {}}, variants)["winner"] is None


def test_a_killed_check_keeps_the_rows_measured_so_far(tmp_path):
    """Rows reach the summary while their section still runs: SIGTERM after the first rung's row
    leaves that row in gpu_check.json, the section marked interrupted."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "WHEEL_DIR": str(tmp_path / "none"),
           "OMP_NUM_THREADS": "1"}
    env.pop("GEMREF_DATA_DIR", None)
    proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--sections", "rungs"],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    rows, deadline = [], time.monotonic() + 400
    try:
        while not rows and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                summary = json.loads((out / "gpu_check.json").read_text())
            except (OSError, ValueError):
                continue
            rows = summary["sections"].get("rungs", {}).get("result", {}).get("rungs", [])
        assert rows and proc.poll() is None, "the first rung's row never reached the summary while the check ran"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["interrupted"] == f"signal {int(signal.SIGTERM)}" and not summary["finished"]
    section = summary["sections"]["rungs"]
    assert section["status"].startswith("interrupted by signal")
    assert section["result"]["rungs"][:len(rows)] == rows and rows[0]["rung"] == "0 baseline"


# The lent device machine: one command runs at most DEVICE_CALL_S, a session gets DEVICE_TOTAL_S
# in all, its start-up (about DEVICE_START_S) included: the terms of the machine this project is lent.
DEVICE_CALL_S, DEVICE_TOTAL_S, DEVICE_START_S = 600, 900, 180


def test_the_whole_check_fits_one_device_call_and_leaves_a_rerun():
    found = _children("dict(sections=[(s.name, s.estimate_s, s.budget_s, s.dry_estimate_s, s.dry_budget_s) "
                      "for s in __main__.SECTIONS], most=__main__.SECTION_MAX_S, default=budget.DEFAULT_BUDGET_S, "
                      "dry=budget.DRY_BUDGET_S)", "__main__", setup="from scripts.gpu_check import budget")
    sections, default = found["sections"], found["default"]
    assert [name for name, *_ in sections] == ["ceilings", "correctness", "timing", "rungs"]   # priority order
    assert all(0 < est <= cap <= found["most"] and 0 < dry_est <= dry_cap for _, est, cap, dry_est, dry_cap in sections)
    assert sum(est for _, est, *_ in sections) <= default          # every section expected to fit one call
    assert default + children_grace_s() <= DEVICE_CALL_S
    # the machine's start, the whole check, then the longest section again at once (while it is held)
    assert DEVICE_START_S + default + max(cap for _, _, cap, *_ in sections) <= DEVICE_TOTAL_S
    assert sum(dry_est for *_, dry_est, _ in sections) <= found["dry"]


def children_grace_s() -> float:
    """The longest a killed section takes to end: SIGTERM's grace, then SIGKILL's wait."""
    return _children("children.KILL_GRACE_S + 5")


FAKE_CLOCK = """
from scripts.gpu_check.budget import Budget
from scripts.gpu_check.children import Section

def scenario(total_s, sections, takes, dry_run=False, spent_s=0.0, missing=lambda s: []):
    now = [100.0]
    budget = Budget(total_s, spent_s=spent_s, clock=lambda: now[0])
    events, summary = [], {}

    def run(section, seconds):
        used = min(takes[section.name], seconds)   # a section past its seconds is killed at them
        now[0] += used
        return {"status": "ok" if takes[section.name] <= seconds else "timeout", "given_s": seconds, "used_s": used}

    def record(name, entry):
        summary[name] = entry
        events.append((name, entry["status"], sorted(summary)))
    __main__.run_in_order(sections, budget, dry_run, run, record, missing=missing)
    return dict(events=events, summary=summary, left=budget.left_s())
"""


def test_sections_run_in_priority_order_within_the_budget_on_a_fake_clock():
    """The real sections on a fake clock: the default budget holds them all when each takes its
    estimate; when the first two run to their caps the rungs no longer fit and are
    skipped, saying why; the summary is recorded as each section starts and ends."""
    fits = _children("scenario(300, __main__.SECTIONS, {s.name: s.estimate_s for s in __main__.SECTIONS}, "
                     "spent_s=10)", "__main__", setup=FAKE_CLOCK)
    assert [(name, status) for name, status, _ in fits["events"]] == [
        (name, status) for name in ("ceilings", "correctness", "timing", "rungs") for status in ("running", "ok")]
    assert [names for *_, names in fits["events"]][1::2] == [
        ["ceilings"], ["ceilings", "correctness"], ["ceilings", "correctness", "timing"],
        ["ceilings", "correctness", "rungs", "timing"]]                    # written after each section
    assert fits["summary"]["ceilings"] == {"status": "ok", "given_s": 60, "used_s": 15, "estimate_s": 15}
    assert fits["summary"]["rungs"]["given_s"] == 300 - 10 - 15 - 60 - 60   # the time left, below its 240 s cap
    assert fits["left"] == 300 - 10 - 15 - 60 - 60 - 150

    slow = _children("scenario(300, __main__.SECTIONS, dict(ceilings=500, correctness=500, timing=30, rungs=150), "
                     "spent_s=10)", "__main__", setup=FAKE_CLOCK)
    summary = slow["summary"]
    assert {summary[name]["status"] for name in ("ceilings", "correctness")} == {"timeout"}
    assert [summary[name]["given_s"] for name in ("ceilings", "correctness", "timing")] == [60, 120, 110]
    assert summary["rungs"]["status"] == ("skipped: out of time (80 s left of the 300 s budget, it needs ~150 s; "
                                          "rerun it alone with --sections rungs)")
    assert ("rungs", "running", ["ceilings", "correctness", "timing"]) not in [tuple(e) for e in slow["events"]]


def test_a_section_that_cannot_fit_leaves_the_time_to_a_cheaper_later_one():
    toy = ("[Section('big', 'm', budget_s=100, dry_budget_s=1, estimate_s=80), "
           "Section('needs_pkg', 'm', budget_s=10, dry_budget_s=1, estimate_s=5, needs=('absent_pkg',)), "
           "Section('small', 'm', budget_s=30, dry_budget_s=1, estimate_s=20)]")
    found = _children(f"scenario(50, {toy}, dict(big=80, needs_pkg=5, small=25), "
                      "missing=lambda s: list(s.needs))", "__main__", setup=FAKE_CLOCK)
    summary = found["summary"]
    assert summary["big"]["status"].startswith("skipped: out of time (50 s left of the 50 s budget, it needs ~80 s")
    assert summary["needs_pkg"]["status"].startswith("skipped: needs absent_pkg, not installed here")
    assert summary["small"] == {"status": "ok", "given_s": 30, "used_s": 25, "estimate_s": 20}
    dry = _children(f"scenario(50, {toy}, dict(big=1, needs_pkg=1, small=1), dry_run=True)", "__main__",
                    setup=FAKE_CLOCK)   # the dry run's own estimates (0 here) and caps (1 s)
    assert {name: entry["given_s"] for name, entry in dry["summary"].items()} == dict(big=1, needs_pkg=1, small=1)


def test_the_budget_comes_from_the_flag_the_environment_or_the_default():
    found = _children("[budget.total_budget(30.0, False, {budget.BUDGET_ENV: '99'}), "
                      "budget.total_budget(None, False, {budget.BUDGET_ENV: ' 99 '}), "
                      "budget.total_budget(None, False, {}), budget.total_budget(None, True, {budget.BUDGET_ENV: ''})]",
                      "budget")
    assert found == [[30.0, "--budget"], [99.0, "GEMREF_GPU_BUDGET_S"], [300.0, "default"],
                     [300.0, "default (dry run)"]]


@pytest.mark.parametrize("args, env_value, said", [
    (["--budget", "0"], None, "--budget 0: the check's budget must be a positive number of seconds"),
    ([], "seven", "GEMREF_GPU_BUDGET_S='seven': expected seconds, e.g. GEMREF_GPU_BUDGET_S=300"),
    ([], "-5", "GEMREF_GPU_BUDGET_S -5: the check's budget must be a positive number of seconds")])
def test_a_bad_budget_is_one_line_and_exit_2(tmp_path, args, env_value, said):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GEMREF_GPU_BUDGET_S", None)
    if env_value is not None:
        env["GEMREF_GPU_BUDGET_S"] = env_value
    proc = subprocess.run([sys.executable, "-m", "scripts.gpu_check", "--dry-run", "--out", str(tmp_path), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(said)
    assert not (tmp_path / "gpu_check.json").exists()


def test_a_budget_too_small_for_any_section_skips_each_and_says_why(tmp_path):
    """The real script end to end, at a budget no section fits: each is skipped with the time
    left, the summary is finished, the exit status says not every section ran."""
    proc, summary = _run_check(tmp_path / "out", tmp_path / "none", "--dry-run", "--budget", "2")
    assert proc.returncode == 1 and summary["finished"] and summary["budget_from"] == "--budget"
    assert list(summary["sections"]) == ["ceilings", "correctness", "timing", "rungs"]
    assert all(s["status"].startswith("skipped: out of time (") and s["status"].endswith(f"--sections {name})")
               for name, s in summary["sections"].items())
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu_check.json", "gpu_check.log"]


def test_the_rungs_fit_an_80_gb_card_by_the_estimate():
    """The base preset at batch 256 with rung 0's materialised scores would not fit; the GPU
    preset's state and the fitted batches do, and rung 2 keeps the preset's batch."""
    found = _children(
        "dict(state=state, base_state=base_state, per_sample=per_sample, "
        "batches=[rungs.fitting_batch(80e9, state, e, 256) for e in per_sample])", "rungs", setup=(
            "import torch\nfrom gemref.parallel.config import MeshShape\nfrom gemref.train.presets import get_preset\n"
            "from gemref.parallel.memory import projected_rank_bytes\n"
            "from gemref.waterfall import LADDER, Context\nfrom gemref.waterfall.rungs import plan\n"
            "preset = rungs.gpu_preset(get_preset('base'))\n"
            "state = projected_rank_bytes(preset.model, MeshShape(1, 1))['total']\n"
            "base_state = projected_rank_bytes(get_preset('base').model, MeshShape(1, 1))['total']\n"
            "configs = [c for _, c in plan(list(LADDER[:3]), preset.train, Context(preset, torch.device('cuda'), 1))]\n"
            "per_sample = [rungs.rung_estimate(preset, c, 2) for c in configs]"))
    assert found["base_state"] > 25e9 and found["state"] < 10e9         # the tables cut to TABLE_ROWS rows
    assert 256 * found["per_sample"][0] > 80e9                          # rung 0 at the preset's batch: no
    assert found["batches"][0] < 256 and found["batches"][1] < 256 and found["batches"][2] == 256
    for batch, per_sample in zip(found["batches"], found["per_sample"]):
        assert found["state"] + batch * per_sample <= 0.8 * 80e9


def test_out_of_memory_retries_only_that_rung_at_half_the_batch():
    calls = _children("[rungs.measured_row(spec, 64, run_at), calls, "
                      "rungs.measured_row(spec, 64, never)['error'], "
                      "rungs.measured_row(spec, 64, broken)['error']]", "rungs", setup=(
                          "import torch\nfrom gemref.waterfall import LADDER\nspec = LADDER[0].spec\ncalls = []\n"
                          "def run_at(batch):\n"
                          "    calls.append(batch)\n"
                          "    if batch > 16:\n"
                          "        raise torch.OutOfMemoryError('CUDA out of memory')\n"
                          "    return {'rung': spec.title, 'status': 'ran', 'batch_size': batch, 'vs_previous': 1.0}\n"
                          "def never(batch):\n"
                          "    raise torch.OutOfMemoryError('CUDA out of memory')\n"
                          "def broken(batch):\n"
                          "    raise RuntimeError('a kernel failed')\n"))
    row, tried, never, broken = calls
    assert tried == [64, 32, 16] and row["batches_tried"] == [64, 32, 16] and row["batch_size"] == 16
    assert "vs_previous" not in row and row["status"] == "ran"
    assert never == "out of memory down to batch 8" and broken == "RuntimeError: a kernel failed"


def test_halving_batch_says_each_fallback_and_the_batch_that_ran():
    from gemref.measure.run import halving_batch

    def run_at(batch):
        if batch > 16:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return f"ran {batch}"

    def never(batch):
        raise torch.OutOfMemoryError("CUDA out of memory")

    said = []
    assert halving_batch(run_at, 64, log=said.append) == ("ran 16", [64, 32, 16])
    assert said == ["out of GPU memory at batch 64: running again at batch 32",
                    "out of GPU memory at batch 32: running again at batch 16"]
    with pytest.raises(torch.OutOfMemoryError):
        halving_batch(never, 4, smallest=2, log=said.append)
    with pytest.raises(ValueError, match="batch and smallest must be >= 1"):
        halving_batch(run_at, 0)


def test_chapters_on_a_gpu_fall_back_to_a_batch_that_fits(monkeypatch):
    """batch_that_fits (chapters 00, 01 and 10 under notebooks/params/gpu.yaml) on a pretend GPU
    whose memory holds batch 64: it probes the padded layout, halves, and says so."""
    import gemref.measure.run as run_module
    from gemref.train.presets import get_preset
    from gemref.train.override import override

    class FakeSetup:
        def __init__(self, train):
            self.train = train

        def step(self, batch):
            if self.train.batch_size > 64:
                raise torch.OutOfMemoryError("CUDA out of memory")

    probed, said = [], []
    monkeypatch.setattr(run_module, "resolve_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(run_module, "setup", lambda preset, train, device, progress: probed.append(train) or
                        FakeSetup(train))
    monkeypatch.setattr(run_module, "sample_batch", lambda s: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    preset = get_preset("base")
    train = override(preset.train, jagged=True, kernel="auto")
    fitted = run_module.batch_that_fits(preset, train, "cuda", log=said.append)
    assert fitted == override(train, batch_size=64)         # only the batch changes
    assert [t.batch_size for t in probed] == [256, 128, 64]
    assert all(not t.attention.jagged and t.attention.kernel == "reference" for t in probed)
    assert said[-1] == "this chapter runs batch 64: out of GPU memory at batch 256 (Fake GPU)"
    monkeypatch.undo()
    assert run_module.batch_that_fits(preset, train, "cpu") is train
