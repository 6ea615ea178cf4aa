"""The walkthrough's reading copy: `gemref notebooks build [--profile ci] [--out DIR]`.

Executes the chapters under a parameter profile (the same batch as `gemref notebooks run`:
executed copies and summary.csv in DIR/executed/), then writes a static site a reader can
browse without a kernel:

  DIR/index.html        per chapter: CPU and wall seconds, its budget, the metrics it
                        recorded; and the waterfall figure of chapter 10 when it was built;
  DIR/<chapter>.html    the executed chapter (nbconvert's lab template) with its outputs and
                        interactive figures; nothing is loaded from a CDN (the template's
                        require.js, MathJax and mermaid tags are left out); exercise answers
                        (cells with `jupyter.source_hidden`) stay collapsed. An executed chapter
                        embeds plotly.js once (gemref.walkthrough.static_figures); its page
                        loads the shared copy instead, so the site holds one plotly.js, not twelve.
  DIR/plotly.min.js     that copy (from plotly's package), for the index and every chapter.

A chapter over its profile's time budget is reported in the index; with `enforce_budget` the
build still writes every page, then fails (OverBudget), like the batch.
"""
from __future__ import annotations

import datetime
import html
import json
import os
import platform
from pathlib import Path

from .batch import OverBudget, run_notebooks
from ..report import fmt
from ..runtime.files import atomic_write_text

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WATERFALL_CHAPTER = "10_waterfall"

# nbconvert's lab template without the CDN scripts, with a navigation bar and collapsed answers.
TEMPLATE = r"""{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block body_header %}{{ super() }}
<nav class="gemref-nav" style="padding:8px 0;font-family:sans-serif">{{ resources.gemref_nav }}</nav>
{% endblock body_header %}
{% block codecell %}
{%- if cell.metadata.get("jupyter", {}).get("source_hidden") -%}
<details class="gemref-answer"><summary style="cursor:pointer;font-weight:bold;padding:4px 0">Worked answer (click to open)</summary>
{{ super() }}
</details>
{%- else -%}
{{ super() }}
{%- endif -%}
{% endblock codecell %}
"""


def chapter_title(notebook: Path) -> str:
    """The first Markdown heading of a notebook, without the '#'."""
    nb = json.loads(Path(notebook).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return Path(notebook).stem


def write_chapter_page(executed: Path, out_dir: Path, nav: str) -> Path:
    """nbconvert one executed chapter to out_dir/<name>.html (no CDN, answers collapsed, the
    embedded plotly.js replaced by out_dir/plotly.min.js)."""
    import jinja2
    import nbformat
    from nbconvert import HTMLExporter
    from plotly.offline import get_plotlyjs

    exporter = HTMLExporter(template_name="lab", extra_loaders=[jinja2.DictLoader({"book.html.j2": TEMPLATE})],
                            template_file="book.html.j2")
    body, _ = exporter.from_notebook_node(nbformat.read(executed, as_version=4),
                                          resources={"gemref_nav": nav, "metadata": {"name": chapter_title(executed)}})
    page = out_dir / f"{executed.stem}.html"
    atomic_write_text(page, body.replace(f"<script>{get_plotlyjs()}</script>", "<script src='plotly.min.js'></script>"))
    return page


def first_figure(executed: Path, title_word: str = "") -> dict | None:
    """The first plotly figure an executed notebook shows (whose title contains title_word)."""
    nb = json.loads(Path(executed).read_text())
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            fig = output.get("data", {}).get(PLOTLY_MIME)
            title = json.dumps(((fig or {}).get("layout") or {}).get("title", ""))
            if fig and title_word.lower() in title.lower():
                return fig
    return None


def readable(key: str) -> str:
    """A recorded metric's name as a reader reads it: "best_rung_mfu_attainable" -> "best rung MFU attainable"."""
    units = {"pct": "(%)", "mb": "(MiB)", "ms": "(ms)", "s": "(s)"}
    names = {"mfu": "MFU", "hfu": "HFU", "ne": "NE", "auc": "AUC", "ac": "AC", "kk": "KK", "flops": "FLOPs",
             "sqnr": "SQNR", "db": "dB", "e2e": "E2E", "gpus": "GPUs"}
    words = key.split("_")
    last = units.get(words[-1]) if len(words) > 1 else None
    return " ".join([names.get(w, w) for w in (words[:-1] if last else words)] + ([last] if last else []))


def _metric_value(key: str, value) -> str:
    if isinstance(value, float) and ("mfu" in key or "share" in key) and "pct" not in key and abs(value) <= 1:
        return f"{100 * value:.2f}%"
    return fmt(value)


def _metrics_cell(row: dict) -> str:
    skip = {"notebook", "seconds", "cpu_seconds", "budget_s", "over_budget"}
    items = "".join(f"<li>{html.escape(readable(k))}: <b>{html.escape(_metric_value(k, v))}</b></li>"
                    for k, v in row.items() if k not in skip and not k.startswith("param."))
    return (f"<details><summary style='cursor:pointer'>{sum(k not in skip for k in row)} measured values</summary>"
            f"<ul style='margin:0;padding-left:1.2em;columns:2'>{items}</ul></details>")


def _figure_div(div: str, fig: dict) -> str:
    return (f"<div id='{div}' style='height:520px'></div><script>var fig_{div} = {json.dumps(fig)};"
            f"Plotly.newPlot('{div}', fig_{div}.data, fig_{div}.layout, {{responsive: true}});</script>")


PREFACE = """<p>gemref reproduces, in a compact and readable form, the training-efficiency work behind Meta's
GEM ads ranking model: jagged batches, fused attention (Flash for softmax, GDPA for pointwise
activations), <code>torch.compile</code>, AutoAC activation checkpointing, load balancing, FSDP on a
2D mesh with sharded embeddings, and float8/MXFP8. Each chapter is one claim, measured on the
machine that built this copy: it opens with a card (what it measures, what it runs on, its time
budget, the command that reproduces its headline figure), asks you to predict before it shows the
answer (the measured answers are behind a click), draws the idea, measures it, and prints what this
run showed, including "no gain here" when that is the outcome.</p>
<p><b>Reading path.</b> 00 defines MFU and measures the baseline; 01-03 remove wasted work (padding,
materialised attention); 04-05 spend less per step (compilation, activation checkpointing); 06-08
are about many ranks (balance, sharding, communication); 09 about low precision; 10 puts the
ladder together and 11 projects it to thousands of GPUs. Chapters 00, 10 and 11 are the spine;
the others can be read in any order after 00.</p>"""


def index_html(rows: list[dict], titles: dict[str, str], profile: str, waterfall: dict | None,
               reference: dict | None = None) -> str:
    """The index page: preface and reading path, the reference waterfall (benchmarks/, what
    `make demo` measured) beside this run's, and per chapter its time and readable metrics."""
    import torch

    from .. import __version__
    from ..mfu.peak import device_name
    from ..report import html_table
    from ..report.figures import waterfall_figure
    from .headline import COLUMNS, TABLE_LABELS, caption, percent_rows

    body = "".join(
        f"<tr><td><a href='{r['notebook']}.html'>{html.escape(titles[r['notebook']])}</a></td>"
        f"<td>{r['cpu_seconds']:.1f}</td><td>{r['seconds']:.1f}</td>"
        f"<td>{fmt(r.get('budget_s'))}{' (over)' if str(r.get('over_budget')) == 'True' else ''}</td>"
        f"<td>{_metrics_cell(r)}</td></tr>" for r in rows)
    if reference:
        ref_rows = reference["record"]["rungs"]
        headline = (f"<p>The number the project stands by: {html.escape(caption(reference))}.</p>"
                    + html_table(percent_rows(ref_rows), COLUMNS, labels=TABLE_LABELS)
                    + _figure_div("reference", json.loads(waterfall_figure(ref_rows, "MFU waterfall (make demo)").to_json())))
    else:
        headline = "<p>No reference waterfall in benchmarks/ (run <code>make demo</code> and keep its record).</p>"
    own = (_figure_div("waterfall", waterfall) if waterfall else
           f"<p>Chapter {WATERFALL_CHAPTER} was not part of this build: no waterfall of this run.</p>")
    built = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    machine = f"{device_name('cpu')} ({os.cpu_count()} CPUs)"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gemref walkthrough: reading copy ({profile})</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}
th{{background:#f4f4f4}}</style><script src='plotly.min.js'></script></head><body>
<h1>gemref walkthrough: reading copy</h1>
{PREFACE}
<h2>The headline: the MFU waterfall</h2>
{headline}
<h3>This copy's own run of the ladder (chapter 10, the <code>{profile}</code> profile's small shapes)</h3>
{own}
<h2>Chapters</h2>
<p>Every chapter executed under the <code>{profile}</code> parameter profile on {html.escape(machine)}
({html.escape(platform.platform())}, Python {platform.python_version()}, torch {torch.__version__},
gemref {__version__}), built {built}. Times are the chapter's CPU seconds (its kernel and the processes
it spawned) and wall seconds; the budget is the profile's limit in CPU seconds.</p>
<table><thead><tr><th>chapter</th><th>CPU s</th><th>wall s</th><th>budget s</th><th>what it measured</th></tr>
</thead><tbody>{body}</tbody></table>
</body></html>
"""


def build_book(profile: str, out_dir: Path, *, names: list[str] | None = None,
               notebook_dir: Path | None = None, enforce_budget: bool = False, log=print) -> list[Path]:
    """Execute the chapters and write the reading copy; return the pages written (index first)."""
    from plotly.offline import get_plotlyjs

    out_dir = Path(out_dir)
    executed = out_dir / "executed"
    late = None
    try:
        rows = run_notebooks(profile, executed, names=names, notebook_dir=notebook_dir,
                             enforce_budget=enforce_budget, log=log)
    except OverBudget as e:
        rows, late = e.rows, e
    atomic_write_text(out_dir / "plotly.min.js", get_plotlyjs())
    titles = {r["notebook"]: chapter_title(executed / f"{r['notebook']}.ipynb") for r in rows}
    order = [r["notebook"] for r in rows]
    pages = []
    for i, name in enumerate(order):
        links = ["<a href='index.html'>contents</a>"]
        if i > 0:
            links.insert(0, f"<a href='{order[i - 1]}.html'>&larr; {html.escape(titles[order[i - 1]])}</a>")
        if i + 1 < len(order):
            links.append(f"<a href='{order[i + 1]}.html'>{html.escape(titles[order[i + 1]])} &rarr;</a>")
        pages.append(write_chapter_page(executed / f"{name}.ipynb", out_dir, " | ".join(links)))
    waterfall = (first_figure(executed / f"{WATERFALL_CHAPTER}.ipynb", "waterfall")
                 if WATERFALL_CHAPTER in order else None)
    from .headline import reference_waterfall

    atomic_write_text(out_dir / "index.html", index_html(rows, titles, profile, waterfall, reference_waterfall()))
    pages.insert(0, out_dir / "index.html")
    log(f"reading copy: {out_dir / 'index.html'} ({len(order)} chapters)")
    if late:
        raise late
    return pages
