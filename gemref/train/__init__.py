"""Training: where the switches compose (compose.py) and the loop that trains and measures (loop.py).

    compose.py  build_model (every switch applied from outside the model), make_optimizer,
                setup (model, optimizer, data, this rank's sampler) -> Setup
    loop.py     run (train, time every step, evaluate, write the run record), launch_runs
                (run on ranks through the one launcher), evaluate, the record's extras
gemref/step.py holds the step itself (below this package: the AC profiler runs it too).
"""
from ..step import NonFiniteError, backward, forward_loss, nonfinite, train_step
from .compose import (Setup, batch_sampler, build_model, make_optimizer, resolve_precision, sample_batch, setup,
                      training_step_breakdown)
from .loop import evaluate, launch_runs, measure_step, measure_step_memory, run

__all__ = ["NonFiniteError", "Setup", "backward", "batch_sampler", "build_model", "evaluate", "forward_loss",
           "launch_runs", "make_optimizer", "measure_step", "measure_step_memory", "nonfinite", "resolve_precision",
           "run", "sample_batch", "setup", "train_step", "training_step_breakdown"]
