"""Training: where the rungs compose (compose.py), the loop (loop.py) and the ranking metrics (metrics.py).

    compose.py  build_model (every switch applied from outside the model, in one fixed order),
                make_optimizer, setup (model, optimizer, data, this rank's sampler) -> Setup
    loop.py     train (resume, step, evaluate, tokens/s and MFU) with LoopHooks for the lab
    metrics.py  NE and AUC
gemref/step.py holds the step itself (below this package: the AC profiler runs it too). The run
record, and `run`/`launch_runs` that write it, are the lab's: gemref/measure/run.py.
"""
from ..step import NonFiniteError, backward, forward_loss, nonfinite, train_step
from .compose import (Setup, batch_sampler, build_model, make_optimizer, resolve_precision, sample_batch, setup)
from .loop import LoopHooks, StepResult, TrainResult, evaluate, measure_step, train

__all__ = ["LoopHooks", "NonFiniteError", "Setup", "StepResult", "TrainResult", "backward", "batch_sampler",
           "build_model", "evaluate", "forward_loss", "make_optimizer", "measure_step", "nonfinite",
           "resolve_precision", "sample_batch", "setup", "train", "train_step"]
