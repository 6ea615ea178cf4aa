"""The walkthrough's tooling: what a chapter calls, and the machinery that runs and publishes them.

What a notebook imports (`from gemref.walkthrough import ...`):
    open_chapter, chapter_time, predicted, runs_on, long_history   chapter.py
    record_metrics                                                  metrics.py

Behind `gemref notebooks run|build`:
    params.py          the parameters cell, its values, the parameter profiles and grids
    batch.py           the papermill batch: run, time, budget, summarise
    book.py            the static reading copy
    static_figures.py  figures that render without a kernel
    best_rung.py       chapter 10's op-class split of the best rung
"""
from .chapter import chapter_time, long_history, open_chapter, predicted, runs_on
from .metrics import record_metrics

__all__ = ["chapter_time", "long_history", "open_chapter", "predicted", "record_metrics", "runs_on"]
