"""Configuration: what assembles a run (the presets, TrainConfig, its record), and the helpers
every technique's section is built from.

Each technique's settings are a section, a small frozen dataclass that sits beside the
technique's code (`ParallelConfig` in gemref/parallel/config.py, ...: SECTIONS below); this
package gathers them into a TrainConfig, so a run record can store it with `dataclasses.asdict`
and a test can build a variant with `override`. Every dataclass checks its fields' types
(values.py) and ranges when built: a bad value is a UsageError (a ValueError) naming the field,
never a silent clamp. One module per thing:

    train.py        TrainConfig: the optimiser's settings and one section per technique,
                    the flat switch names, `with_switches`
    section.py      what the sections share (`switch` fields: flag, help, choices)
    presets.py      Preset, PRESETS, preset_on_dataset
    record.py       a TrainConfig in a record and back (RECORD_VERSION; old flat records load)
    override.py     `override`: change fields by name, checked
    checks.py, values.py   range checks; typed values (parse text by a field's type)

This file imports none of them: `from gemref.config import X` loads X's module on first use
(gemref/runtime/lazy.py), so a section module (which imports section.py, hence runs this file)
never finds this package half-built, and `import gemref.config` stays cheap.
"""
from __future__ import annotations

from ..runtime.lazy import lazy_exports

# The sections that sit beside their technique: {module: names it defines}.
SECTIONS = {
    "gemref.attention.config": ("KERNEL_NAMES", "AttentionConfig"),
    "gemref.autoac.config": ("AC_COMPRESSIONS", "AC_MODES", "AC_PLAN_PATTERN", "ActivationCheckpointConfig"),
    "gemref.balance.config": ("BALANCE_POLICIES", "BalanceConfig"),
    "gemref.checkpoint.config": ("CheckpointConfig",),
    "gemref.compile.config": ("COMPILE_REGIONS", "CompileConfig", "parse_compile_regions"),
    "gemref.data.config": ("LENGTH_PROFILES", "DataConfig", "DatasetFolder"),
    "gemref.model.config": ("ATTENTION_ACTIVATIONS", "ModelConfig"),
    "gemref.parallel.config": ("BACKENDS", "EMBEDDING_ENGINES", "SPARSE_SHARDINGS", "TABLE_OPTIMIZERS",
                               "TORCHREC_SHARDINGS", "EmbeddingConfig", "MeshShape", "ParallelConfig", "parse_mesh"),
    "gemref.precision.config": ("PRECISIONS", "PRECISION_KERNELS", "PrecisionConfig"),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, SECTIONS | {
    ".checks": ("MAX_SEED",),
    ".override": ("override",),
    ".presets": ("DATA_FIELDS", "PRESETS", "Preset", "get_preset", "preset_on_dataset"),
    ".record": ("RECORD_VERSION", "record_version", "train_as_record", "train_from_record"),
    ".train": ("TrainConfig", "switch_names", "switch_values", "with_switches"),
})
