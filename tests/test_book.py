"""The reading copy: `gemref notebooks build` executes chapters under a profile and writes static
pages that need no kernel and load nothing from the network.

The real chapters come from the reading copy `make test` builds before pytest (every chapter,
GEMREF_BOOK; tests/book_ci.py), or, run by hand, from chapter 06 alone (analytic: seconds) built
here; the rest uses toy notebooks. Whether the figures actually draw is
tests/test_walkthrough.py's job (a browser).
"""
from __future__ import annotations

import json
import re

import nbformat
import pytest

from book_ci import ci_book, summary
from gemref.walkthrough.book import build_book, first_figure, index_html
from gemref.cli import main
from gemref.walkthrough.batch import OverBudget

PLOTLY_MIME = "application/vnd.plotly.v1+json"


@pytest.fixture(scope="module")
def book(tmp_path_factory, data_root):
    """(folder of a reading copy holding chapter 06, the chapters it holds in order)."""
    out = ci_book(["06_load_balancing"], tmp_path_factory.mktemp("book"))
    return out, list(summary(out))


def _figures(executed) -> int:
    nb = json.loads(executed.read_text())
    return sum(PLOTLY_MIME in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))


def test_build_writes_index_chapter_and_plotly(book):
    out, chapters = book
    assert "06_load_balancing" in chapters and (out / "index.html").exists()
    for name in chapters:
        assert (out / f"{name}.html").exists() and (out / "executed" / f"{name}.ipynb").exists(), name
    assert (out / "plotly.min.js").stat().st_size > 1_000_000


def test_chapter_page_is_static_and_offline(book):
    out, _ = book
    page = (out / "06_load_balancing.html").read_text()
    # no script or stylesheet from the network: CI and readers may be offline
    assert not re.findall(r"<(?:script|link)[^>]*(?:src|href)=[\"']https?://", page)
    # plotly.js comes from the site's one copy; every figure of the executed chapter has its own draw call
    assert page.count("Plotly.newPlot(") == _figures(out / "executed" / "06_load_balancing.ipynb") >= 3
    assert page.count("<script src='plotly.min.js'></script>") == 1 and not re.findall(r"\* plotly\.js v\d", page)
    executed = (out / "executed" / "06_load_balancing.ipynb").read_text()
    assert len(re.findall(r"\* plotly\.js v\d", executed)) == 1, "the executed chapter embeds plotly.js once"
    assert "You will measure" in page and "Reproduce the headline figure" in page      # the opening card
    assert page.count("<details class=\"gemref-answer\">") == 2                        # collapsed answers
    assert "round robin imbalance at 8 ranks" in page and "your guess" in page         # a prediction printed
    assert re.search(r"all \d+ checks passed", page)                                  # the last cell, chapter.close


def test_index_lists_times_and_metrics(book):
    out, chapters = book
    index = (out / "index.html").read_text()
    assert "<a href='06_load_balancing.html'>06 · Load balancing" in index
    row = re.search(r"06_load_balancing\.html'>.*?</tr>", index, re.S).group(0)
    cpu, wall, budget = re.findall(r"<td>([0-9.]+)</td>", row)[:3]
    assert float(cpu) > 0 and float(wall) > 0 and budget == "60"
    assert "imbalance KK: <b>" in row and "bubble cut: <b>" in row        # readable names, values bold
    if "10_waterfall" in chapters:                              # the waterfall figure, drawn from chapter 10
        assert "Plotly.newPlot('waterfall'" in index and "was not part of this build" not in index
    else:
        assert "was not part of this build" in index


def test_index_draws_the_waterfall_offline():
    fig = {"data": [{"type": "bar", "x": ["0 baseline"], "y": [1.0]}], "layout": {"title": {"text": "MFU waterfall"}}}
    rows = [{"notebook": "10_waterfall", "cpu_seconds": 1.0, "seconds": 2.0, "budget_s": 60, "rungs_ran": 4}]
    reference = {"record": {"preset": "small", "ranks": 2, "rungs": [
        {"rung": "0 baseline", "key": "baseline", "status": "ran", "windows_kept": 3, "windows": 3, "tokens_per_s": 1000.0,
         "tokens_per_s_min": 900.0, "tokens_per_s_max": 1100.0, "local_mfu": 0.01, "scaling_ratio": 0.9, "mfu": 0.009,
         "peak_memory_bytes": 2**20, "vs_previous": 1.0, "vs_baseline": 1.0}]},
        "folder": "2026-12-03-cpu-x", "measured_on": {"date_utc": "2026-12-03", "device": "CPU X", "cpu_count": 2,
                                                    "ranks": 2, "torch": "2.13"},
        "command": "gemref waterfall --preset small --ranks 2"}
    page = index_html(rows, {"10_waterfall": "10 · The MFU waterfall"}, "ci", fig, reference)
    assert "<script src='plotly.min.js'></script>" in page and "Plotly.newPlot('waterfall'" in page
    assert json.dumps(fig) in page and "rungs ran: <b>4</b>" in page           # readable metric names
    assert "Reading path" in page and "gemref waterfall --preset small --ranks 2" in page     # preface, headline
    assert "Plotly.newPlot('reference'" in page and "<th>E2E MFU</th>" in page and "0.9%" in page


def test_first_figure_picks_by_title(tmp_path):
    nb = nbformat.v4.new_notebook()
    outputs = [nbformat.v4.new_output("display_data", data={PLOTLY_MIME: {"data": [], "layout": {"title": {"text": t}}}})
               for t in ("breakdown", "MFU waterfall: tiny")]
    nb.cells = [nbformat.v4.new_code_cell("", outputs=outputs)]
    nbformat.write(nb, tmp_path / "x.ipynb")
    assert first_figure(tmp_path / "x.ipynb", "waterfall")["layout"]["title"]["text"] == "MFU waterfall: tiny"
    assert first_figure(tmp_path / "x.ipynb", "nothing like it") is None


def test_over_budget_is_reported_or_enforced_after_the_pages(tmp_path):
    folder = tmp_path / "nb"
    (folder / "params").mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("X = 1")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# 00 · Toy"), params,
                nbformat.v4.new_code_cell("from gemref.walkthrough import record_metrics\nrecord_metrics({'x': X})")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "00_toy.ipynb")
    (folder / "params" / "ci.yaml").write_text("budget_s: 0.01\n")      # a kernel's start-up alone costs more
    build_book("ci", tmp_path / "reported", notebook_dir=folder, log=lambda s: None)
    assert "0.01 (over)" in (tmp_path / "reported" / "index.html").read_text()
    with pytest.raises(OverBudget, match="00_toy"):
        build_book("ci", tmp_path / "out", notebook_dir=folder, enforce_budget=True, log=lambda s: None)
    assert "00 · Toy" in (tmp_path / "out" / "00_toy.html").read_text()
    assert "00 · Toy" in (tmp_path / "out" / "index.html").read_text()


def test_cli_build_rejects_an_unknown_profile(tmp_path, capsys):
    assert main(["notebooks", "build", "--profile", "nope", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown profile 'nope'" in err[0]
