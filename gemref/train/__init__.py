"""Training: what assembles a run (its config, the presets, the record's config), where the rungs
compose (compose.py), the loop (loop.py) and the ranking metrics (metrics.py).

    config.py   TrainConfig: the optimiser's settings and one section per technique (each
                section sits beside its technique: gemref/autoac/config.py, ...), the flat
                switch names, `with_switches`
    presets.py  Preset, PRESETS, get_preset, preset_on_dataset, dataset_preset
    record.py   a TrainConfig in a record and back (RECORD_VERSION; old records load)
    override.py `override`: change a config dataclass's fields by name, checked
    compose.py  build_model (every switch applied from outside the model, in one fixed order),
                make_optimizer, setup (model, optimizer, data, this rank's sampler) -> Setup
    loop.py     train (resume, step, evaluate, tokens/s and MFU) with LoopHooks for the lab;
                run_description (a run's identity in its checkpoints)
    metrics.py  NE and AUC
The assembly sits here, above every technique, because it imports each technique's section;
the helpers the sections are built from are gemref/config/, the bottom layer. The names below
load on first use (gemref/runtime/lazy.py), so `from gemref.train.config import TrainConfig`
(the command line, before torch) loads neither torch nor the loop. gemref/step.py holds the
step itself (below this package: the AC profiler runs it too). The run record, and
`run`/`launch_runs` that write it, are the lab's: gemref/measure/run.py.
"""
from ..runtime.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "..step": ("NonFiniteError", "backward", "forward_loss", "nonfinite", "train_step"),
    ".compose": ("Setup", "batch_sampler", "build_model", "make_optimizer", "resolve_precision", "sample_batch",
                 "setup"),
    ".loop": ("LoopHooks", "StepResult", "TrainResult", "evaluate", "measure_step", "train"),
})
