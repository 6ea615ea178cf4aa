"""Training: what assembles a run, where the rungs compose, the loop and the ranking metrics.

    config.py, presets.py, record.py, override.py   TrainConfig (one section per technique),
                the presets, the record's config, `override`: above every technique, since they
                import each one's section (gemref/config/ holds only the sections' helpers)
    compose.py  build_model (every switch applied from outside the model, in one fixed order),
                make_optimizer, setup (model, optimizer, data, this rank's sampler) -> Setup
    loop.py     train (resume, step, evaluate, tokens/s and MFU) with LoopHooks for the lab
    metrics.py  NE and AUC
Names load on first use (gemref/runtime/lazy.py): `from gemref.train.config import TrainConfig`
loads neither torch nor the loop. gemref/step.py holds the step itself; the run record is the lab's
(gemref/measure/run.py).
"""
from ..runtime.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "..step": ("NonFiniteError", "backward", "forward_loss", "nonfinite", "train_step"),
    ".compose": ("Setup", "batch_sampler", "build_model", "make_optimizer", "resolve_precision", "sample_batch",
                 "setup"),
    ".loop": ("LoopHooks", "StepResult", "TrainResult", "evaluate", "measure_step", "train"),
})
