"""What a walkthrough chapter calls: its opening card, figures every viewer can show, and the
reader's predictions printed beside the measurements.

* `open_chapter(...)` (the cell after the parameters) shows the chapter's card: what it
  measures, what it runs on, the time budget of every parameter profile
  (notebooks/params/<profile>.yaml, enforced by `gemref notebooks run`), and the `gemref`
  command that reproduces its headline figure. It also starts the chapter's clocks and sets
  plotly's renderers (below).
* Figures render in static viewers too (gemref/walkthrough/static_figures.py).
* `chapter_time()` is the CPU and wall seconds since `open_chapter`; what a chapter shows
  (tables, predictions) is gemref/walkthrough/display.py.
* `long_history(preset, max_len, len_sigma)`: the preset with longer histories on a small
  dataset, the case where padding and materialised attention dominate a step (chapters 01-03
  under the `ci` profile); `runs_on(device, ranks)` says where a chapter runs, in words.
"""
from __future__ import annotations

import resource
import time
from pathlib import Path

from .params import NOTEBOOK_DIR, load_profile
from .static_figures import use_static_figures

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


def long_history(preset, max_len: int | None = None, len_sigma: float | None = None, samples: int = 4096):
    """`preset` with longer histories: up to `max_len` events and log-normal sigma `len_sigma`
    (same median: a heavier tail), on a dataset of `samples` training rows (a quarter as many
    eval rows), generated once on first use. None keeps the preset's value; both None: unchanged."""
    from ..train.override import override

    if max_len is None and len_sigma is None:
        return preset
    model = override(preset.model, max_len=max_len or preset.model.max_len)
    data = override(preset.data, len_sigma=preset.data.len_sigma if len_sigma is None else len_sigma,
                    n_train=samples, n_eval=max(1, samples // 4), shard_rows=samples)
    name = f"{preset.name}-L{model.max_len}-s{data.len_sigma:g}"
    return override(preset, name=name, model=model, data=data)


def _runnable(names, why_not) -> list[str]:
    """`names` less those `why_not(name)` gives a reason for; each left out is printed with it."""
    kept = []
    for name in names:
        reason = why_not(name)
        if reason:
            print(f"{name}: n/a here, because {reason}")
        else:
            kept.append(name)
    return kept


def runnable_precisions(precisions, device: str) -> list[str]:
    """The precisions that run on `device` here, natively or emulated (gemref/precision/support.py's
    gates); each that cannot is printed as "<precision>: n/a here, because <the failing gate>"."""
    from ..env import resolve_device
    from ..precision.support import precision_support

    dev = resolve_device(device)
    return _runnable(precisions, lambda p: None if (s := precision_support(p, dev)).runs else s.reason)


def runnable_variants(variants, device: str) -> list[str]:
    """Chapter 12's quality variants (gemref/measure/quality.py) that run on `device` here; each
    that cannot is printed as "<variant>: n/a here, because <reason>"."""
    from ..env import resolve_device
    from ..measure.quality import variant_support

    dev = resolve_device(device)
    return _runnable(variants, lambda v: None if (s := variant_support(v, dev)).runs else s.reason)
