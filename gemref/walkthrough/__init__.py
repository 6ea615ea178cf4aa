"""The walkthrough's tooling: what a chapter calls, and the machinery that runs and publishes them.

What a notebook imports (`from gemref.walkthrough import ...`):
    Chapter, Prediction (card and predictions; metrics, answers and checks at the close)  chapter.py
    runs_on, long_history                                           chapter.py
    runnable_precisions, runnable_variants ("n/a here, because ...") chapter.py
    show_table, show                                                display.py
    e2e_mfu_calculator, memory_calculator                           calculators.py
    the sentences about this run's results                          findings.py
    each chapter's takeaway sentences, one call per chapter            takeaways.py
    engine_rows, plan_rows, engines_figure (gemref's tables vs TorchRec's)   engines.py
    record_metrics (what Chapter.close calls)                       metrics.py

Behind `gemref notebooks run|build`:
    params.py          the parameters cell, its values, the parameter profiles and grids
    batch.py           the papermill batch: run, time, budget, summarise
    book.py            the static reading copy
    static_figures.py  figures that render without a kernel
    best_rung.py       chapter 10's op-class split of the best rung
"""
from .chapter import Chapter, Prediction, long_history, runnable_precisions, runnable_variants, runs_on
from .display import show, show_table
from .metrics import record_metrics

__all__ = ["Chapter", "Prediction", "long_history", "record_metrics", "runnable_precisions", "runnable_variants",
           "runs_on", "show", "show_table"]
