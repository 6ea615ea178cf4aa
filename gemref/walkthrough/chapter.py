"""What a walkthrough chapter calls: two calls frame it, its card and its checks.

* `chapter = Chapter(name, measures=, runs_on=, command=, predictions=[Prediction(...), ...])`
  (the cell after the parameters) shows the chapter's card: what it measures, what it runs on,
  the time budget of every parameter profile (notebooks/params/<profile>.yaml, enforced by
  `gemref notebooks run`), the `gemref` command that reproduces its headline figure, and the
  reader's predictions (PREDICT_* parameters, None until set). It starts the chapter's clocks
  and makes figures render in static viewers too (gemref/walkthrough/static_figures.py).
* `chapter.close(metrics, checks)` (the last cell, "Checks (for the test run)") records the
  metrics (gemref/walkthrough/metrics.py, read by tests/test_notebooks.py), answers every
  prediction from them (the measured value behind a reveal), and runs the checks: {what must
  hold, in words: whether it held}; one AssertionError names every check that failed, else it
  prints "all N checks passed" and the chapter's CPU and wall seconds since its card.
* `long_history(preset, max_len, len_sigma)`: the preset with longer histories on a small
  dataset, the case where padding and materialised attention dominate a step (chapters 01-03
  under the `ci` profile); `runs_on(device, ranks)` says where a chapter runs, in words.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .display import formatted_value, is_number, prediction_bundle, show
from .metrics import record_metrics
from .params import NOTEBOOK_DIR, load_profile
from .static_figures import use_static_figures


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the child processes it has waited for (ranks)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def profile_budgets(name: str, params_dir: Path | None = None) -> dict[str, float | None]:
    """{profile: budget in CPU seconds (None: no budget)} over notebooks/params/*.yaml, for one chapter."""
    params_dir = params_dir or NOTEBOOK_DIR / "params"
    out = {}
    for path in sorted(params_dir.glob("*.yaml")):
        prof = load_profile(path.stem, params_dir)
        out[path.stem] = prof["budgets"].get(name, prof["budget_s"])
    return out


@dataclass(frozen=True)
class Prediction:
    """A reader's guess at one number the chapter measures: the parameter that holds it (None
    until the reader sets it), the question in words, and the key of `Chapter.close`'s metrics
    whose value (times `scale`) answers it, shown with `fmt` and `unit` beside the guess."""
    parameter: str
    guess: Any
    question: str
    metric: str
    fmt: str = ".3g"
    unit: str = ""
    scale: float = 1.0          # 100: a fraction recorded, asked in %


def card_markdown(name: str, *, measures: str, runs_on: str, command: str,
                  predictions: Sequence[Prediction] = (), params_dir: Path | None = None) -> str:
    """The chapter's opening table, and the reader's predictions under it, as Markdown."""
    times = " · ".join(f"`{p}` ≤ {b:g} s" if b else f"`{p}`: no budget"
                       for p, b in profile_budgets(name, params_dir).items())
    rows = [("You will measure", measures), ("Runs on", runs_on),
            ("Time per profile (CPU seconds; `gemref notebooks run --profile P` fails a chapter over it)", times),
            ("Reproduce the headline figure", f"`{command}`")]
    card = "| | |\n|---|---|\n" + "\n".join(f"| **{k}** | {v} |" for k, v in rows)
    if predictions:
        card += ("\n\n**Your predictions** (set them in the parameters cell; the last cell answers them):\n\n"
                 + "\n".join(f"- {p.question}: `{p.parameter}` = "
                              + ("not set" if p.guess is None else formatted_value(p.guess, p.fmt, p.unit))
                              for p in predictions))
    return card


def runs_on(device: str, ranks: int = 1) -> str:
    """Where a chapter's runs happen, in words, from its DEVICE and RANKS parameters."""
    if device == "cuda":
        return "one GPU" if ranks == 1 else f"{ranks} GPUs, one NCCL rank each"
    where = "one GPU if there is one, else the CPU" if device == "auto" else "CPU"
    return f"{where}, one process" if ranks == 1 else f"{where}, {ranks} ranks (processes, gloo on CPU)"


class Chapter:
    """One chapter's card (shown when made), clocks, and closing checks; see the module docstring."""

    def __init__(self, name: str, *, measures: str, runs_on: str, command: str,
                 predictions: Sequence[Prediction] = ()):
        from IPython.display import Markdown, display

        self.name, self.predictions = name, list(predictions)
        self._cpu0, self._wall0 = _cpu_seconds(), time.perf_counter()
        display(Markdown(card_markdown(name, measures=measures, runs_on=runs_on, command=command,
                                       predictions=self.predictions)))
        use_static_figures()

    def time(self) -> dict[str, float]:
        """{"cpu_s", "wall_s"} since the card (kernel start-up and imports before it excluded)."""
        return {"cpu_s": _cpu_seconds() - self._cpu0, "wall_s": time.perf_counter() - self._wall0}

    def close(self, metrics: Mapping[str, Any], checks: Mapping[str, Any]) -> None:
        """Record `metrics`, answer the predictions from them, and run `checks` ({what must hold:
        whether it did}); AssertionError listing every failed check. ValueError when a prediction's
        metric is missing from `metrics`."""
        missing = [f"{p.parameter} -> {p.metric!r}" for p in self.predictions if p.metric not in metrics]
        if missing:
            raise ValueError(f"{self.name}: predictions answered by metrics close() was not given: {missing}")
        if unjudged := [what for what, held in checks.items() if not isinstance(held, (bool, np.bool_))]:
            raise ValueError(f"{self.name}: a check must be True or False: {unjudged}")
        record_metrics(dict(metrics))
        if self.predictions:
            answers = []
            for p in self.predictions:
                value = metrics[p.metric]
                measured = ("not measured in this run" if value is None else
                            value * p.scale if is_number(value) else value)
                answers.append(prediction_bundle(p.question, p.guess, measured, p.fmt, p.unit, p.parameter))
            show({"text/html": "".join(h for h, _ in answers), "text/plain": "\n".join(t for _, t in answers)})
        failed = [what for what, held in checks.items() if not held]
        if failed:
            raise AssertionError(f"{self.name}: {len(failed)} of {len(checks)} checks failed:\n"
                                 + "\n".join(f"- {what}" for what in failed))
        t = self.time()
        print(f"all {len(checks)} checks passed; chapter ran {t['cpu_s']:.1f} s CPU, {t['wall_s']:.1f} s wall "
              "since its card")


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
