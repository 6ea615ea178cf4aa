"""Configuration: model presets (tiny, small, base, large), data and training switches.

Everything a run depends on is a small frozen dataclass, so a run record can store it with
`dataclasses.asdict` and a test can build a variant with `override`. Every dataclass checks its
fields' types (gemref/config/values.py) and ranges when built: a bad value is a UsageError (a
ValueError) naming the field, never a silent clamp. One module per thing:

    model.py        ModelConfig (the architecture's shape), DataConfig (the synthetic data)
    dataset.py      DatasetFolder (a dataset folder as a preset's data)
    train.py        TrainConfig: the optimiser's settings and one section per technique,
                    the flat switch names, `with_switches`
    attention.py, compile.py, activation_checkpoint.py, balance.py, parallel.py,
    precision.py, embeddings.py, checkpoint.py
                    the sections, each with its valid values and its own rules
    section.py      what the sections share (`switch` fields: flag, help, choices)
    presets.py      Preset, PRESETS, preset_on_dataset
    record.py       a TrainConfig in a record and back (RECORD_VERSION; old flat records load)
    override.py     `override`: change fields by name, checked
    checks.py, values.py   range checks; typed values (parse text by a field's type)
"""
from __future__ import annotations

from .activation_checkpoint import AC_COMPRESSIONS, AC_MODES, AC_PLAN_PATTERN, ActivationCheckpointConfig
from .attention import KERNEL_NAMES, AttentionConfig
from .balance import BALANCE_POLICIES, BalanceConfig
from .checkpoint import CheckpointConfig
from .checks import MAX_SEED
from .compile import COMPILE_REGIONS, CompileConfig, parse_compile_regions
from .dataset import DatasetFolder
from .embeddings import EMBEDDING_ENGINES, TORCHREC_SHARDINGS, EmbeddingConfig
from .model import ATTENTION_ACTIVATIONS, LENGTH_PROFILES, DataConfig, ModelConfig
from .override import override
from .parallel import BACKENDS, SPARSE_SHARDINGS, TABLE_OPTIMIZERS, MeshShape, ParallelConfig, parse_mesh
from .precision import PRECISION_KERNELS, PRECISIONS, PrecisionConfig
from .presets import DATA_FIELDS, PRESETS, Preset, get_preset, preset_on_dataset
from .record import RECORD_VERSION, record_version, train_as_record, train_from_record
from .train import TrainConfig, switch_names, switch_values, with_switches

__all__ = [
    "AC_COMPRESSIONS", "AC_MODES", "AC_PLAN_PATTERN", "ATTENTION_ACTIVATIONS", "BACKENDS", "BALANCE_POLICIES",
    "COMPILE_REGIONS", "DATA_FIELDS", "EMBEDDING_ENGINES", "KERNEL_NAMES", "LENGTH_PROFILES", "MAX_SEED",
    "PRECISIONS", "PRECISION_KERNELS", "PRESETS", "RECORD_VERSION", "SPARSE_SHARDINGS", "TABLE_OPTIMIZERS",
    "TORCHREC_SHARDINGS",
    "ActivationCheckpointConfig", "AttentionConfig", "BalanceConfig", "CheckpointConfig", "CompileConfig",
    "DataConfig", "DatasetFolder", "EmbeddingConfig", "MeshShape", "ModelConfig", "ParallelConfig",
    "PrecisionConfig", "Preset", "TrainConfig", "get_preset", "override", "parse_compile_regions", "parse_mesh",
    "preset_on_dataset", "record_version", "switch_names", "switch_values", "train_as_record",
    "train_from_record", "with_switches",
]
