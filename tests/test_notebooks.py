"""Every notebook runs headless under the `ci` profile and records metrics that make sense (its
time is recorded beside them, never judged: a notebook over its budget is reported by the batch).

Under `make test` the chapters ran once, before pytest, as the reading copy
(`gemref notebooks build --profile ci --out artifacts/book/ci`, GEMREF_BOOK): these tests read
its executed copies and times (tests/book_ci.py). Run by hand without GEMREF_BOOK, each test
executes its chapter here into artifacts/notebooks/ci/ (open them in JupyterLab for the figures).
"""
import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from book_ci import executed, prebuilt, summary
from gemref.errors import UsageError
from gemref.walkthrough.batch import NotebookFailure, OverBudget, run_notebooks, timed_execute
from gemref.walkthrough.metrics import read_metrics
from gemref.walkthrough.params import NOTEBOOK_DIR, declared_parameters, load_profile, profile_params

OUT = Path(__file__).resolve().parent.parent / "artifacts" / "notebooks" / "ci"
NOTEBOOKS = sorted(p.stem for p in NOTEBOOK_DIR.glob("[0-9]*.ipynb"))

# What each notebook's recorded metrics must satisfy under the ci profile.
EXPECT = {
    "00_mfu_baseline": lambda m: (m["flops_relative_error"] <= 0.02 and m["executed_over_model"] > 1.5
                                  and 0 < m["mfu"] < 1 and m["tokens_per_s"] > 0),
    "01_jagged_batches": lambda m: (m["skewed_padded_over_model"] > m["skewed_jagged_over_model"] > 1
                                    and m["memory_ratio"] > 1 and m["mfu_jagged"] > 0),
    "02_flash_attention": lambda m: m["memory_ratio_sdpa"] > 3 and m["fused_kernel"] == "sdpa",
    "03_gdpa": lambda m: (m["gdpa_kernel"] == "cpu_fused" and m["mfu_gdpa"] > 0
                         and 0 < m["window_flops_vs_full_at_max"] < 1),
    "06_load_balancing": lambda m: (m["imbalance_kk"] <= 1.02 < m["imbalance_round_robin"]
                                    and m["bubble_cut"] > 0.9 and m["local_exchange_bytes"] == 0 and m["local_once"]
                                    and m["local_of_optimum"] > m["round_robin_of_optimum"]),
    # a busy machine may leave no uncontended pair of windows: then the ratio is None, and says why
    "10_waterfall": lambda m: (m["rungs_ran"] >= 3 and m["flops_per_sample_spread"] == 1.0
                               and (m["full_ladder_vs_baseline"] > 0 if m["full_ladder_vs_baseline"] is not None
                                    else m["contended_windows"] > 0)
                               # the best rung's step by op class: GEMMs are part of it; what the step would be
                               # with its GEMMs at the probed peak is a what-if of two timings: reported, not judged
                               and 0 < m["best_rung_gemm_share"] < 1 and 0 < m["best_rung_mfu_profiled"] < 1
                               and m["best_rung_mfu_gemm_at_peak"] > 0 and m["best_rung_step_kept_at_peak"] > 0),
    # MXFP8's mean eval loss over the seeds inside fp32's seed band, which fp32's own learning exceeds
    "09_mxfp8": lambda m: (m["mxfp8_min_layer_output_sqnr_db"] > 12 and m["mx_block_sqnr_median_db"] > 25
                           and m["seeds"] >= 2 and m["mxfp8_within_fp32_seed_band"] is True
                           and m["fp32_loss_drop"] > m["loss_band_tolerance"] > 0
                           and (m["bf16_over_fp32_peak"] is None or m["bf16_over_fp32_peak"] > 0)
                           and (m["bf16_step_speedup"] is None or m["bf16_step_speedup"] > 0)),
    "07_fsdp_2d": lambda m: (m["max_rel_loss_diff"] <= 1e-5 and abs(m["ddp_fraction"] - 1) <= 0.05
                             and all(abs(m[k] - 1) <= 0.05 for k in ("fsdp_x_shards", "hsdp_x_shards", "sparse_x_shards"))
                             and m["table_wise_imbalance"] >= 1 and m["projected_fsdp_gb"] < m["projected_ddp_gb"]
                             # TorchRec beside gemref's tables: both engines timed, DMPCollection refuses a CPU
                             and all(m[k] > 0 for k in ("torchrec_row_vs_native", "torchrec_table_vs_native",
                                                         "torchrec_planner_vs_native_row"))
                             and m["torchrec_planner_max_table_bytes"] > 0 and m["native_row_max_table_bytes"] > 0
                             and m["dmp_collection_refused_cpu"]),
    "08_communication": lambda m: (abs(m["bytes_ratio"] - 1) <= 0.05 and 0 < m["reshard_false_saving"] < 1
                                   and 0 <= m["overlapped_share_rank0"] <= 1
                                   and m["hsdp_comm_share_at_max"] < m["fsdp_comm_share_at_max"]
                                   and m["ncclx_vs_nccl_step"] < 1),
    "04_torch_compile": lambda m: (m["recompiles_after_warmup"] == 0 and m["graphs"] > 0 and m["fused_kernels"] > 0
                                   and m["eager_step_s"] > 0 and m["compiled_step_s"] > 0
                                   and 0 < m["mfu_compiled"] < 1 and 0 <= m["regions_planned"] <= 6
                                   and (m["regions_planned"] == 0) == (m["planned_over_eager"] is None)),
    "05_autoac": lambda m: (m["auto_fits_every_budget"] and m["auto_prediction_error"] < 0.05
                            and m["auto_over_full_recompute_at_half"] <= 0.5 and m["full_recompute_pct"] > 0
                            and m["time_plan_seconds_over_full_at_half"] <= 1.0 + 1e-9
                            and m["autoac_batch"] > m["no_ac_batch"] >= 1 and m["joint_no_worse_than_uniform"]
                            and m["compressed_act_ratio"] < 0.75 and m["compressed_no_ac_batch"] > m["no_ac_batch"]
                            and m["compressed_parity_within_band"]),
    # MovieLens-100K (or, offline, the made-up sample: then only that the runs were scored): ids carry signal, and
    # the model beats the eval base rate
    "12_real_data": lambda m: (m["seeds"] >= 2 and m["ne_like_fast_sd"] >= 0 and (
        m["dataset"] != "MovieLens-100K" or (m["ne_like_logistic"] < m["ne_like_constant"] and m["ne_like_fast"] < 1
                                             and m["auc_like_fast"] > 0.6))),
    # a TorchRec model gemref did not define: counted FLOPs = the hand count, padding costs FLOPs, MFU = local x scaling,
    # op classes sum to the profiled step, a compiled region compiles once, AutoAC refuses it
    "13_bring_your_own_model": lambda m: (m["padded_over_jagged"] > 1 and 0 < m["mfu"] < 1
                                          and abs(m["mfu"] - m["local_mfu"] * m["scaling_ratio"]) <= 1e-9
                                          and m["op_classes_sum_to_step"] and m["kernels_agree_on_flops"]
                                          and m["attention_pct"] > 0 and m["autoac_applies"]
                                          and m["compiled_recompiles"] in (None, 0)),
    "11_scale_projection": lambda m: (0 < m["baseline_mfu"] < m["full_ladder_mfu"] < 1 and m["bandwidth_monotonic"]
                                      and m["imbalance_round_robin"] > m["imbalance_balanced"] >= 1
                                      and m["table_sync_gain"] >= 1
                                      and 0 < m["mfu_1gpu_needed_low"] < m["mfu_1gpu_needed_high"] <= 1),
}


def test_every_notebook_has_expectations():
    assert set(NOTEBOOKS) == set(EXPECT), "add the new notebook's metric checks to EXPECT"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_under_ci_profile(name, data_root):
    book = prebuilt()
    if book is not None:                  # make test: the reading copy built before pytest
        metrics, clock = read_metrics(executed(book, name)), summary(book)[name]
    else:
        metrics, clock = timed_execute(NOTEBOOK_DIR / f"{name}.ipynb", OUT / f"{name}.ipynb", profile_params("ci", name))
    assert clock["cpu_seconds"] > 0 and clock["seconds"] > 0, clock
    assert metrics, f"{name} recorded no metrics"
    assert EXPECT[name](metrics), metrics


def test_the_ci_profile_is_the_committed_defaults():
    """`pytest --nbmake notebooks/` (in `make test`) runs the defaults, the reading copy runs the
    ci profile: one set of values, so the two runs check the same chapters."""
    for name in NOTEBOOKS:
        defaults = declared_parameters(NOTEBOOK_DIR / f"{name}.ipynb")
        differ = {k: (v, defaults.get(k)) for k, v in profile_params("ci", name).items() if defaults.get(k) != v}
        assert not differ, f"{name}: the ci profile sets (value, default) {differ}: change the notebook's default"


def test_notebooks_are_committed_clean():
    for name in NOTEBOOKS:
        nb = nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4)
        tags = [c.metadata.get("tags", []) for c in nb.cells]
        assert any("parameters" in t for t in tags), f"{name}: no parameters cell"
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{name}: outputs"
        raw = json.loads((NOTEBOOK_DIR / f"{name}.ipynb").read_text())   # nbformat.read fills missing ids in
        ids = [c.get("id") for c in raw["cells"]]        # nbformat 4.5: every cell has a unique id
        assert all(ids) and len(set(ids)) == len(ids), f"{name}: a cell without a unique id"


def _toy_notebooks(folder: Path, body: str) -> Path:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("X = 1  # any int")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body),
                nbformat.v4.new_code_cell("from gemref.walkthrough import record_metrics\nrecord_metrics({'x': X})")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (folder / "params").mkdir(parents=True)
    (folder / "params" / "ci.yaml").write_text("global:\n  X: 2\n")
    nbformat.write(nb, folder / "00_toy.ipynb")
    return folder


def test_batch_collects_metrics_over_a_grid(tmp_path):
    folder = _toy_notebooks(tmp_path / "nb", "assert X > 0")
    rows = run_notebooks("ci", tmp_path / "out", notebook_dir=folder, grid={"X": [3, 4]}, log=lambda s: None)
    assert [r["x"] for r in rows] == [3, 4]
    assert "x" in (tmp_path / "out" / "summary.csv").read_text().splitlines()[0]
    assert (tmp_path / "out" / "summary.html").exists()


def test_batch_fails_loudly_on_a_failing_cell(tmp_path):
    folder = _toy_notebooks(tmp_path / "nb", "raise RuntimeError('boom')")
    with pytest.raises(NotebookFailure, match=r"00_toy failed: cell 2 \(`raise RuntimeError\(.boom.\)`\) raised RuntimeError: boom"):
        run_notebooks("ci", tmp_path / "out", notebook_dir=folder, log=lambda s: None)


def test_batch_rejects_unknown_parameters(tmp_path):
    folder = _toy_notebooks(tmp_path / "nb", "pass")
    with pytest.raises(ValueError, match=r"00_toy: unknown parameter\(s\) \['Y'\]; it declares X"):
        run_notebooks("ci", tmp_path / "out", notebook_dir=folder, params={"Y": 1}, log=lambda s: None)
    with pytest.raises(ValueError, match="unknown notebook"):
        run_notebooks("ci", tmp_path / "out", notebook_dir=folder, names=["99_nope"], log=lambda s: None)


# --- the chapter shape and what the batch measures ----------------------------------------

def _chapter(name: str):
    return nbformat.read(NOTEBOOK_DIR / f"{name}.ipynb", as_version=4).cells


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_chapter_opens_with_a_card_and_ends_with_checks(name):
    """Two calls frame a chapter: `Chapter(...)` right after the parameters (its card and the
    reader's predictions) and `chapter.close(...)` in the last cell, under a "Checks (for the test
    run)" heading (metrics, answers, checks). No other cell asserts, bar the worked answers."""
    cells = _chapter(name)
    first_params = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
    card = cells[first_params + 1]
    assert card.cell_type == "code" and f'Chapter(\n    "{name}"' in card.source, card.source
    last, heading = cells[-1], cells[-2]
    assert last.cell_type == "code" and "\nchapter.close(\n" in "\n" + last.source, last.source
    assert heading.cell_type == "markdown" and heading.source.startswith("## Checks (for the test run)"), heading.source
    calls = [i for i, c in enumerate(cells) if c.cell_type == "code" and re.search(
        r"\b(Chapter|Prediction|predicted|record_metrics|open_chapter|chapter_time)\(|\.close\(", c.source)]
    assert calls == [first_params + 1, len(cells) - 1], f"{name}: card/prediction/metric/check calls in cells {calls}"
    asserting = [c.id for c in cells[:-1] if c.cell_type == "code" and re.search(r"^\s*assert ", c.source, re.M)
                 and not c.metadata.get("jupyter", {}).get("source_hidden")]
    assert not asserting, f"{name}: cells {asserting} assert: move the check into chapter.close(checks=...)"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_chapter_has_two_predictions_and_two_worked_exercises(name):
    cells = _chapter(name)
    code = "\n".join(c.source for c in cells if c.cell_type == "code")
    guesses = re.findall(r"^(PREDICT_\w+) = None$", code, re.M)
    assert len(guesses) >= 2, guesses
    assert set(guesses) <= set(declared_parameters(NOTEBOOK_DIR / f"{name}.ipynb")), \
        "the guesses belong in the parameters cell, where papermill and --param can set them"
    card = next(c.source for c in cells if "Chapter(" in c.source)
    for guess in guesses:   # each guess is a Prediction on the card, answered by a metric at the close
        assert f'Prediction("{guess}", {guess},' in card, guess
    answers = [i for i, c in enumerate(cells) if c.metadata.get("jupyter", {}).get("source_hidden")]
    assert len(answers) >= 2, "at least two exercises with collapsed worked answers"
    for i in answers:
        question = cells[i - 1]
        assert question.cell_type == "markdown" and re.search(r"\*\*\d\.", question.source), question.source
        assert cells[i].cell_type == "code" and "print(" in cells[i].source


class _Page:
    """What a Chapter shows, captured instead of displayed (no kernel in a unit test)."""

    def __init__(self, monkeypatch):
        import IPython.display

        from gemref.walkthrough import chapter

        self.shown, self.metrics = [], []
        monkeypatch.setattr(IPython.display, "display", lambda obj, **kw: self.shown.append(obj.data))
        monkeypatch.setattr(chapter, "use_static_figures", lambda: None)
        monkeypatch.setattr(chapter, "show", lambda bundle: self.shown.append(bundle["text/plain"]))
        monkeypatch.setattr(chapter, "record_metrics", self.metrics.append)


def test_chapter_shows_its_card_answers_predictions_and_runs_its_checks(monkeypatch, capsys):
    from gemref.walkthrough import Chapter, Prediction

    page = _Page(monkeypatch)
    chapter = Chapter("06_load_balancing", measures="m", runs_on="CPU", command="gemref x", predictions=[
        Prediction("PREDICT_A", 1.5, "imbalance", "imbalance", fmt=".2f"),
        Prediction("PREDICT_B", None, "kept", "kept", fmt=".1f", unit="%", scale=100),
        Prediction("PREDICT_C", None, "gain", "gain")])
    card = page.shown[0]
    assert "You will measure" in card and "- imbalance: `PREDICT_A` = 1.50" in card and "`PREDICT_B` = not set" in card
    chapter.close({"imbalance": 1.25, "kept": 0.875, "gain": None}, checks={"a holds": True, "b holds": 1 > 0})
    assert page.metrics == [{"imbalance": 1.25, "kept": 0.875, "gain": None}]
    lines = page.shown[1].splitlines()
    assert lines[0] == "imbalance  your guess: 1.50  |  measured: 1.25"
    assert lines[1].startswith("kept  your guess: -  |  measured: 87.5%  (set PREDICT_B in the parameters cell")
    assert "measured: not measured in this run" in lines[2]
    assert re.fullmatch(r"all 2 checks passed; chapter ran [0-9.]+ s CPU, [0-9.]+ s wall since its card\n",
                        capsys.readouterr().out)


def test_chapter_close_names_every_failed_check_and_a_missing_answer(monkeypatch):
    from gemref.walkthrough import Chapter, Prediction

    _Page(monkeypatch)
    chapter = Chapter("00_x", measures="m", runs_on="CPU", command="c",
                      predictions=[Prediction("PREDICT_A", None, "q", "a")])
    with pytest.raises(ValueError, match=r"00_x: predictions answered by metrics close\(\) was not given: "
                                         r"\[\"PREDICT_A -> 'a'\"\]"):
        chapter.close({"b": 1}, checks={})
    with pytest.raises(AssertionError, match="00_x: 2 of 3 checks failed:\n- kk within 2% \\(1.5\\)\n- local once$"):
        chapter.close({"a": 1}, checks={"kk within 2% (1.5)": False, "lpt no worse": True, "local once": False})
    with pytest.raises(ValueError, match=r"00_x: a check must be True or False: \['real rows'\]"):
        chapter.close({"a": 1}, checks={"real rows": None, "kk": np.float64(1.0) < 2})   # None would pass silently


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_parameter_cells_parse_for_papermill(name, caplog):
    """papermill's line parser (used when it injects parameters) sees what gemref sees, silently."""
    import papermill

    with caplog.at_level("WARNING", logger="papermill"):
        seen = set(papermill.inspect_notebook(str(NOTEBOOK_DIR / f"{name}.ipynb")))
    assert seen == set(declared_parameters(NOTEBOOK_DIR / f"{name}.ipynb"))
    assert not [r for r in caplog.records if "Unable to parse" in r.getMessage()]


def test_profile_budgets_are_checked(tmp_path):
    (tmp_path / "params").mkdir()
    for bad in ("budget_s: -1", "budget_s: fast", "budgets: {00_x: 0}", "budget_s: true"):
        (tmp_path / "params" / "p.yaml").write_text(bad + "\n")
        with pytest.raises(ValueError, match="positive number of CPU seconds"):
            load_profile("p", tmp_path / "params")
    assert load_profile("ci")["budget_s"] == 60


def test_batch_times_each_notebook_and_reports_or_enforces_its_budget(tmp_path, capfd):
    folder = _toy_notebooks(tmp_path / "nb", "x = sum(i * i for i in range(10))")
    (folder / "params" / "ci.yaml").write_text("budget_s: 600\nglobal:\n  X: 2\n")
    rows = run_notebooks("ci", tmp_path / "ok", notebook_dir=folder, log=lambda s: None)
    assert rows[0]["cpu_seconds"] > 0 and rows[0]["seconds"] > 0 and rows[0]["budget_s"] == 600
    assert rows[0]["over_budget"] is False
    assert "cpu_seconds" in (tmp_path / "ok" / "summary.csv").read_text().splitlines()[0]
    assert "TCP" not in capfd.readouterr().err, "the kernel must talk over IPC, not TCP"
    # starting a kernel alone costs more than 0.01 s of CPU: over any such budget
    (folder / "params" / "ci.yaml").write_text("budget_s: 600\nbudgets:\n  00_toy: 0.01\nglobal:\n  X: 2\n")
    said = []
    rows = run_notebooks("ci", tmp_path / "reported", notebook_dir=folder, log=said.append)
    assert rows[0]["over_budget"] is True and rows[0]["x"] == 2            # reported, the run still counts
    assert any("over the ci profile's budget of 0.01 s CPU" in line for line in said), said
    with pytest.raises(OverBudget, match=r"00_toy failed: over the ci profile's time budget: 00_toy [0-9.]+ s CPU "
                                         r"> 0.01 s \(wall [0-9.]+ s\)") as failed:
        run_notebooks("ci", tmp_path / "late", notebook_dir=folder, enforce_budget=True, log=lambda s: None)
    assert failed.value.rows[0]["notebook"] == "00_toy"
    assert (tmp_path / "late" / "summary.csv").exists(), "the summary is written before the batch fails"


def test_mxfp8_chapter_refuses_one_seed(tmp_path):
    """A seed band needs two seeds: chapter 09 says so before it trains anything, and the
    runner reports it as the user's mistake (UsageError: exit 2), naming the notebook."""
    with pytest.raises(UsageError, match=r"notebook 09_mxfp8: .* refused a parameter: SEEDS=1: a seed band needs "
                                         r"at least 2 seeds per precision"):
        run_notebooks("ci", tmp_path / "out", names=["09_mxfp8"], params={"SEEDS": 1}, log=lambda s: None)


def _printed(executed_path: Path) -> str:
    nb = nbformat.read(executed_path, as_version=4)
    return "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stdout")


def test_a_chapters_findings_follow_its_run_when_the_outcome_flips(tmp_path):
    """Chapter 11 run twice, its two length tails in rising and in falling order (the projection is
    analytic, so each run's straggler factors are exact): the printed finding says "rises" for one
    and "falls" for the other, and quotes the factors in the order it ran them."""
    sigmas = [0.6, 1.2]
    rows = run_notebooks("ci", tmp_path, names=["11_scale_projection"], log=lambda s: None,
                         params={"BANDWIDTH_SCALES": [1.0, 2.0], "TABLE_SYNC_EVERY": [1, 10], "VALIDATE": False},
                         grid={"LEN_SIGMAS": [sigmas, sigmas[::-1]]})
    assert len(rows) == 2
    lines = [next(line for line in _printed(tmp_path / f"11_scale_projection-{i:03d}.ipynb").splitlines()
                  if line.startswith("As the log-normal sigma")) for i in (0, 1)]
    assert "goes 0.6 -> 1.2, round robin's straggler factor rises" in lines[0], lines[0]
    assert "goes 1.2 -> 0.6, round robin's straggler factor falls" in lines[1], lines[1]
    forward = re.search(r"rises \(([^)]*)\)", lines[0]).group(1).split(", ")
    backward = re.search(r"falls \(([^)]*)\)", lines[1]).group(1).split(", ")
    assert forward == backward[::-1] and float(forward[0]) < float(forward[1])
