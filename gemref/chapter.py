"""What a walkthrough chapter calls: its opening card, figures every viewer can show, and the
reader's predictions printed beside the measurements.

* `open_chapter(...)` (the cell after the parameters) shows the chapter's card: what it
  measures, what it runs on, the time budget of every parameter profile
  (notebooks/params/<profile>.yaml, enforced by `gemref notebooks run`), and the `gemref`
  command that reproduces its headline figure. It also starts the chapter's clocks and sets
  plotly's renderers (below).
* Figures: JupyterLab draws `application/vnd.plotly.v1+json` (interactive), but a static
  viewer (nbconvert HTML, the reading copy of `gemref notebooks build`) ignores it. After
  `open_chapter`, every `fig.show()` also carries `text/html` that draws with the plotly.js
  embedded once per notebook (offline, no CDN: plotly's Python package ships plotly.min.js)
  and, where a Chromium is installed for kaleido, an `image/png` fallback for viewers that
  run no scripts.
* `predicted(...)` prints the reader's guess (a parameter, None until they set it) beside
  the measured value; `chapter_time()` is the CPU and wall seconds since `open_chapter`.
* `long_history(preset, max_len, len_sigma)`: the preset with longer histories on a small
  dataset, the case where padding and materialised attention dominate a step (chapters 01-03
  under the `ci` profile); `runs_on(device, ranks)` says where a chapter runs, in words.
* Chapter 10: `best_rung(rows)` picks the waterfall rung with the highest MFU and
  `profile_rung(preset, row)` splits one rank's step of it by op class (GEMM, attention,
  element-wise, optimizer, other) with the step time if every GEMM ran at the best rate a probe
  finds for its shape (gemref/bench/step_profile.py); `limit_stacks` gives the figure's bars.
"""
from __future__ import annotations

import atexit
import base64
import resource
import time
from pathlib import Path

from .notebooks import NOTEBOOK_DIR, load_profile

PNG_SIZE = (900, 500)          # pixels of the static fallback (width, height)
_clock: dict[str, float] = {}


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the child processes it has waited for (ranks)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def chapter_time() -> dict[str, float]:
    """{"cpu_s", "wall_s"} since `open_chapter` (kernel start-up and imports before it excluded)."""
    if not _clock:
        raise RuntimeError("chapter_time() needs open_chapter() first")
    return {"cpu_s": _cpu_seconds() - _clock["cpu"], "wall_s": time.perf_counter() - _clock["wall"]}


def profile_budgets(name: str, params_dir: Path | None = None) -> dict[str, float | None]:
    """{profile: budget in CPU seconds (None: no budget)} over notebooks/params/*.yaml, for one chapter."""
    params_dir = params_dir or NOTEBOOK_DIR / "params"
    out = {}
    for path in sorted(params_dir.glob("*.yaml")):
        prof = load_profile(path.stem, params_dir)
        out[path.stem] = prof["budgets"].get(name, prof["budget_s"])
    return out


def card_markdown(name: str, *, measures: str, runs_on: str, command: str,
                  params_dir: Path | None = None) -> str:
    """The chapter's opening table, as Markdown."""
    times = " · ".join(f"`{p}` ≤ {b:g} s" if b else f"`{p}`: no budget"
                       for p, b in profile_budgets(name, params_dir).items())
    rows = [("You will measure", measures), ("Runs on", runs_on),
            ("Time per profile (CPU seconds; `gemref notebooks run --profile P` fails a chapter over it)", times),
            ("Reproduce the headline figure", f"`{command}`")]
    return "| | |\n|---|---|\n" + "\n".join(f"| **{k}** | {v} |" for k, v in rows)


def runs_on(device: str, ranks: int = 1) -> str:
    """Where a chapter's runs happen, in words, from its DEVICE and RANKS parameters."""
    if device == "cuda":
        return "one GPU" if ranks == 1 else f"{ranks} GPUs, one NCCL rank each"
    where = "one GPU if there is one, else the CPU" if device == "auto" else "CPU"
    return f"{where}, one process" if ranks == 1 else f"{where}, {ranks} ranks (processes, gloo on CPU)"


def open_chapter(name: str, *, measures: str, runs_on: str, command: str) -> None:
    """Show the chapter's card, start its clocks, and make figures render in static viewers."""
    from IPython.display import Markdown, display

    _clock.update(cpu=_cpu_seconds(), wall=time.perf_counter())
    display(Markdown(card_markdown(name, measures=measures, runs_on=runs_on, command=command)))
    use_static_figures()


def predicted(question: str, guess, measured, fmt: str = ".3g", unit: str = "", parameter: str = "") -> str:
    """One line: the reader's guess beside the measured value (printed and returned)."""
    shown = "-" if guess is None else f"{guess:{fmt}}{unit}" if isinstance(guess, (int, float)) else str(guess)
    value = f"{measured:{fmt}}{unit}" if isinstance(measured, (int, float)) else str(measured)
    line = f"{question}  your guess: {shown}  |  measured: {value}"
    if guess is None and parameter:
        line += f"  (set {parameter} in the parameters cell to commit to a guess)"
    print(line)
    return line


def long_history(preset, max_len: int | None = None, len_sigma: float | None = None, samples: int = 4096):
    """`preset` with longer histories: up to `max_len` events and log-normal sigma `len_sigma`
    (same median: a heavier tail), on a dataset of `samples` training rows (a quarter as many
    eval rows), generated once on first use. None keeps the preset's value; both None: unchanged."""
    from .config import override

    if max_len is None and len_sigma is None:
        return preset
    model = override(preset.model, max_len=max_len or preset.model.max_len)
    data = override(preset.data, len_sigma=preset.data.len_sigma if len_sigma is None else len_sigma,
                    n_train=samples, n_eval=max(1, samples // 4), shard_rows=samples)
    name = f"{preset.name}-L{model.max_len}-s{data.len_sigma:g}"
    return override(preset, name=name, model=model, data=data)


# --- figures that static viewers draw ------------------------------------------------------

def _html_renderer():
    """text/html drawing with window.Plotly (embedded once by `use_static_figures`), no MathJax."""
    from plotly.io import to_html
    from plotly.io._base_renderers import MimetypeRenderer

    class OfflineHtml(MimetypeRenderer):
        def to_mimebundle(self, fig_dict):
            return {"text/html": to_html(fig_dict, include_plotlyjs=False, include_mathjax=False,
                                         full_html=False, default_width="100%", default_height=450,
                                         validate=False)}
    return OfflineHtml()


def _png_renderer():
    """image/png through kaleido on one Chromium kept open for the kernel's life."""
    import kaleido
    from plotly.io._base_renderers import MimetypeRenderer

    class KaleidoPng(MimetypeRenderer):
        started = False

        def to_mimebundle(self, fig_dict):
            if not self.started:
                kaleido.start_sync_server(mathjax=False, silence_warnings=True)
                atexit.register(kaleido.stop_sync_server, silence_warnings=True)
                self.started = True
            png = kaleido.calc_fig_sync(fig_dict, opts=dict(format="png", width=PNG_SIZE[0], height=PNG_SIZE[1]))
            return {"image/png": base64.b64encode(png).decode()}
    return KaleidoPng()


def use_static_figures(png: bool | None = None) -> str:
    """Set plotly's default renderers to the interactive mimetype + offline HTML (+ PNG where
    a Chromium is installed, or as `png` says); embed plotly.js once. Returns the renderer names."""
    import plotly.io as pio
    from IPython.display import display
    from plotly.offline import get_plotlyjs

    from .report.figures import find_chromium

    pio.renderers["gemref_html"] = _html_renderer()
    names = ["plotly_mimetype", "gemref_html"]
    if png if png is not None else find_chromium() is not None:
        pio.renderers["gemref_png"] = _png_renderer()
        names.append("gemref_png")
    pio.renderers.default = "+".join(names)
    script = f"<script>window.PlotlyConfig = {{MathJaxConfig: 'local'}};</script>\n<script>{get_plotlyjs()}</script>"
    display({"text/html": script}, raw=True)
    return pio.renderers.default


# --- chapter 10: the best rung's step by op class, and what its GEMMs leave on the table ----

LIMIT_CASES = {"step": "measured step", "gemm_at_best_rate": "GEMMs at the probe's best rate",
               "gemm_at_peak": "GEMMs at the CPU's fp32 peak"}


def best_rung(rows: list[dict]) -> tuple[dict, str]:
    """(the waterfall row that ran with the highest E2E MFU, why it was chosen); on a machine so
    busy that no rung kept a window (no MFU), the last rung that ran. ValueError when none ran."""
    ran = [r for r in rows if r["status"] == "ran"]
    if not ran:
        raise ValueError("no rung of this waterfall ran")
    measured = [r for r in ran if r.get("mfu") is not None]
    if measured:
        best = max(measured, key=lambda r: r["mfu"])
        return best, f"the highest MFU of the waterfall, {best['mfu']:.2%}"
    return ran[-1], "the last rung that ran: every waterfall window was contended, so no rung has an MFU to rank by"


def limit_stacks(record: dict) -> dict[str, dict[str, float]]:
    """{case: {op class: ms per step}} for each case of a step_profile record's "limits": the
    profiled classes scaled to the unprofiled step, the GEMM part replaced by what the case
    allows (the same arithmetic as the limits: step - GEMM + GEMM at that rate)."""
    classes = {r["class"]: r["ms_per_step"] for r in record["classes"] if r["ms_per_step"] > 0 or r["class"] == "gemm"}
    limits = {r["case"]: r["step_ms"] for r in record["limits"]}
    scale = limits["step"] / (1e3 * record["profiled_step_s"])
    rest = {k: v * scale for k, v in classes.items() if k != "gemm"}
    gemm_now = classes["gemm"] * scale
    return {case: {"gemm": ms - (limits["step"] - gemm_now), **rest} for case, ms in limits.items()}


def profile_rung(preset, row: dict, *, ranks: int = 1, warmup: int = 2, timed_steps: int = 5,
                 profile_steps: int = 2, probe_reps: int = 5) -> dict:
    """One rank's step of a waterfall rung (a row of its record) on the CPU, in this process, by
    op class, with its GEMMs probed alone (gemref.bench.step_profile.profile_step): the rung's
    switches at its per-rank batch; load balancing and sharding are left out, as they split
    the work and add communication but leave one rank's local step as it is. Returns
    profile_step's record with "rung" (key), "title", "batch_size" and "stacks" (limit_stacks)."""
    from .bench.step_profile import profile_step
    from .config import override
    from .train import sample_batch, setup

    sw = row["switches"]
    train = override(preset.train, eval_every=0, eval_batches=1, batch_size=max(1, row["batch_size"] // ranks),
                     jagged=sw["jagged"], kernel=sw["kernel"], compile=sw["compile"], ac=sw["ac"],
                     ac_budget=sw["ac_budget"], precision=sw["precision"])
    s = setup(preset, train, device="cpu")
    record = profile_step(s, sample_batch(s), warmup=warmup, timed_steps=timed_steps, profile_steps=profile_steps,
                          probe_reps=probe_reps)
    return {**record, "rung": row["key"], "title": row["rung"], "batch_size": train.batch_size,
            "stacks": limit_stacks(record)}
