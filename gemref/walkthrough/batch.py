"""The papermill batch that runs the notebooks (`gemref notebooks run`).

`run_notebooks(...)` executes notebooks through papermill with a parameter profile
(notebooks/params/<profile>.yaml) and optional grid, then gathers every notebook's recorded
metrics into one table (CSV + HTML). A failing notebook is a NotebookFailure naming the
notebook and the cell; a parameter a notebook does not declare in its `parameters` cell, a
value of another type than the declared default's, or a grid/profile file that is missing
or not valid YAML is a UsageError naming it, raised before the first notebook runs.

An executed copy is written as a hidden partial file and renamed when papermill finishes (a
failing notebook's copy included); an interrupted batch (Ctrl-C, SIGTERM: gemref/cli.py)
kills the notebook's kernel with its process group (the ranks it spawned die with it) and
removes the partial copy, so each executed copy is complete or absent.

Each row records the notebook's wall seconds and CPU seconds (its kernel and every process the
kernel waited for, e.g. spawned ranks: the time it costs whatever else the machine runs). A
profile may set `budget_s` (CPU seconds per notebook) and `budgets: {notebook: seconds}`: a
notebook over its budget is reported (a log line, `over_budget` in its row), and the batch fails
with `OverBudget` after writing the summary only when asked to (`enforce_budget`, the CLI's
`--enforce-budget`: for sizing a profile on an idle machine). A time is a measurement, and a
shared machine's is noisy: by default it never fails a run.
"""
from __future__ import annotations

import csv
import html
import io
import json
import logging
import resource
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path


from ..errors import UsageError
from ..runtime.files import atomic_write_text, write_json
from ..runtime.interrupt import children, kill_group
from .metrics import read_metrics
from .params import NOTEBOOK_DIR, check_params, declared_parameters, expand_grid, load_profile, profile_params, select_notebooks
from ..report import format_table



KERNEL_CLEANUP_S = 30      # an interrupted batch waits this long for papermill to let its killed kernel go


class _DropPapermillNoise(logging.Filter):
    """papermill's own parameter inference warns about lines it cannot parse and names it does
    not find; gemref reads the parameters cell with ast and checks every name itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(("Unable to parse line", "Passed unknown parameter"))


def execute(notebook: Path, out_path: Path, params: dict, *, progress: bool = False) -> dict:
    """Run one notebook with papermill; return its metrics. Raises NotebookFailure or UsageError."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    check_params(notebook.stem, params, declared_parameters(notebook))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(f".{out_path.stem}.partial.ipynb")
    noise, loggers = _DropPapermillNoise(), [logging.getLogger("papermill"), logging.getLogger("papermill.translators")]
    for lg in loggers:
        lg.addFilter(noise)
    try:
        with tempfile.TemporaryDirectory(prefix="gemref-kernel-") as sockets:
            _without_signals(lambda: papermill.execute_notebook(
                str(notebook), str(partial), parameters=params, cwd=str(notebook.parent), progress_bar=progress,
                kernel_name="python3", config=kernel_config(sockets)))
        partial.replace(out_path)
    except PapermillExecutionError as e:
        partial.replace(out_path)
        if e.ename == "UsageError":     # a parameter value the notebook refused: the user's mistake (exit 2)
            raise UsageError(f"notebook {notebook.stem}: {_failing_cell(out_path)} refused a parameter: "
                             f"{e.evalue} (executed copy: {out_path})") from None
        raise NotebookFailure(notebook.stem, f"{_failing_cell(out_path)} raised {e.ename}: {e.evalue} "
                                             f"(executed copy: {out_path})") from None
    except BaseException:          # interrupted, or papermill failed: no half-written copy
        partial.unlink(missing_ok=True)
        raise
    finally:
        for lg in loggers:
            lg.removeFilter(noise)
    return read_metrics(out_path)


def _without_signals(run):
    """run() in a worker thread while this (main) thread waits: papermill's event loop cannot
    install its own SIGINT/SIGTERM handlers there, so gemref's stay in charge (gemref/cli.py).
    Interrupted meanwhile, this thread kills the kernel it started with its process group,
    lets papermill clean up (a bounded wait) and re-raises."""
    before, outcome = children(), {}

    def target():
        try:
            outcome["value"] = run()
        except BaseException as e:     # handed to the main thread
            outcome["error"] = e

    worker = threading.Thread(target=target, name="papermill", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.5)
    except BaseException:
        for pid in children() - before:
            kill_group(pid)
        worker.join(KERNEL_CLEANUP_S)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def kernel_config(sockets: str):
    """The kernel talks to papermill over local IPC sockets, not TCP (nothing to eavesdrop on,
    and no "Kernel is running over TCP without encryption" warning on every run), made in the
    folder `sockets` (absolute: a killed kernel leaves them there, not in the notebook's folder)."""
    from traitlets.config import Config

    return Config({"KernelManager": {"transport": "ipc", "ip": str(Path(sockets, "kernel"))}})


@dataclass
class NotebookFailure(Exception):
    notebook: str
    detail: str

    def __str__(self) -> str:
        return f"notebook {self.notebook} failed: {self.detail}"


def _failing_cell(executed: Path) -> str:
    """'cell N (`first line`)', N counting the source notebook's cells from 1 (papermill's
    parameter and error-banner cells are not counted)."""
    nb = json.loads(executed.read_text())
    added = {"injected-parameters", "papermill-error-cell-tag"}   # cells papermill inserts
    cells = [c for c in nb["cells"] if not added & set(c.get("metadata", {}).get("tags", []))]
    for i, cell in enumerate(cells, start=1):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            source = "".join(cell["source"]).strip().splitlines()
            return f"cell {i} (`{source[0] if source else ''}`)"
    return "a cell"


def run_notebooks(profile: str, out_dir: Path, *, names: list[str] | None = None,
                  params: dict | None = None, grid: dict | None = None,
                  notebook_dir: Path | None = None, enforce_budget: bool = False, log=print) -> list[dict]:
    """Execute notebooks x grid points; write summary.csv/.html into out_dir; return the rows.
    `enforce_budget`: raise OverBudget (after the summary) if a notebook ran over its budget.
    Every notebook's parameters (names and types) are checked before the first one runs."""
    notebook_dir = notebook_dir or NOTEBOOK_DIR
    prof = load_profile(profile, notebook_dir / "params")
    declared = set().union(*(declared_parameters(nb) for nb in select_notebooks(None, notebook_dir)))
    # A profile's "global" values apply to the notebooks that declare them; a global name no
    # notebook declares is a typo, as is any per-notebook, --param or grid name (check_params).
    unused = sorted(set(prof["global"]) - declared)
    if unused:
        raise UsageError(f"profile {profile!r}: global parameter(s) {unused} are declared by no notebook")
    selected = select_notebooks(names, notebook_dir)
    points = expand_grid(grid or {})
    plan = []
    for nb in selected:
        for i, point in enumerate(points):
            merged = {**profile_params(profile, nb.stem, notebook_dir), **(params or {}), **point}
            check_params(nb.stem, merged, declared_parameters(nb))
            plan.append((nb, point, merged, "" if len(points) == 1 else f"-{i:03d}"))
    rows = []
    for n, (nb, point, merged, tag) in enumerate(plan, start=1):
        log(f"[{n}/{len(plan)}] {nb.stem}{tag} {point or ''}")
        metrics, clock = timed_execute(nb, out_dir / f"{nb.stem}{tag}.ipynb", merged)
        budget = prof["budgets"].get(nb.stem, prof["budget_s"])
        over = bool(budget) and clock["cpu_seconds"] > budget
        rows.append({"notebook": nb.stem, **{f"param.{k}": v for k, v in point.items()}, **clock,
                     "budget_s": budget, "over_budget": over, **metrics})
        log(f"    {clock['cpu_seconds']:.1f} s CPU, {clock['seconds']:.1f} s wall"
            + (f": over the {profile} profile's budget of {budget:g} s CPU" if over else ""))
    write_summary(rows, out_dir)
    if enforce_budget:
        check_budgets(rows, profile)
    return rows


def timed_execute(notebook: Path, out_path: Path, params: dict) -> tuple[dict, dict]:
    """`execute`, plus {"seconds": wall, "cpu_seconds": CPU of the kernel and its waited-for
    children}. Notebooks run one at a time, so no other child ends inside the window."""
    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    cpu0, wall0 = cpu(), time.perf_counter()
    metrics = execute(notebook, out_path, params)
    return metrics, {"seconds": round(time.perf_counter() - wall0, 2), "cpu_seconds": round(cpu() - cpu0, 2)}


class OverBudget(NotebookFailure):
    """Notebooks that ran past their profile's CPU budget; `rows` is the batch's summary."""

    def __init__(self, notebook: str, detail: str, rows: list[dict]):
        super().__init__(notebook, detail)
        self.rows = rows


def check_budgets(rows: list[dict], profile: str) -> None:
    """Raise OverBudget naming every row whose CPU seconds passed its budget."""
    late = [r for r in rows if r.get("budget_s") and r["cpu_seconds"] > r["budget_s"]]
    if late:
        raise OverBudget(", ".join(r["notebook"] for r in late),
                         "over the " + profile + " profile's time budget: " + "; ".join(
                             f"{r['notebook']} {r['cpu_seconds']:.1f} s CPU > {r['budget_s']:g} s "
                             f"(wall {r['seconds']:.1f} s)" for r in late), rows)


def write_summary(rows: list[dict], out_dir: Path) -> None:
    """summary.csv, .html, .txt and .json of the batch's rows, each written atomically."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out_dir / "summary.csv", text.getvalue())
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in columns)
                    + "</tr>" for r in rows)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    atomic_write_text(out_dir / "summary.html",
                      f"<table border=1><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>\n")
    atomic_write_text(out_dir / "summary.txt", format_table(rows, columns) + "\n")
    write_json(out_dir / "summary.json", rows)


def read_summary(out_dir: Path) -> list[dict]:
    """The rows a batch wrote into `out_dir` (summary.json)."""
    return json.loads((Path(out_dir) / "summary.json").read_text())
