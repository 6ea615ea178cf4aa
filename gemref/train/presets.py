"""Presets: a model, its data and training settings (tiny, small, base, large), and a preset
moved onto a dataset folder (`preset_on_dataset`; by the folder's path: `dataset_preset`)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..data.config import DataConfig, DatasetFolder
from ..errors import UsageError
from ..model.config import ModelConfig
from .config import TrainConfig

DATA_FIELDS = ("item_vocab", "action_vocab", "time_buckets", "sparse_vocab", "n_dense")   # a dataset's, in a ModelConfig


@dataclass(frozen=True)
class Preset:
    """A model, its data (the synthetic generator's config, or a dataset folder) and training settings."""

    name: str
    model: ModelConfig
    data: DataConfig | DatasetFolder
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        where = f"the {self.name} preset's" if isinstance(self.data, DataConfig) else f"dataset {self.data.folder}:"
        if isinstance(self.data, DataConfig) and self.data.median_len > self.model.max_len:
            raise UsageError(f"DataConfig.median_len={self.data.median_len} exceeds the {self.name} preset's "
                             f"max_len={self.model.max_len} (histories are at most max_len events)")
        if isinstance(self.data, DatasetFolder):
            for name in DATA_FIELDS:
                if getattr(self.model, name) != getattr(self.data, name):
                    raise UsageError(f"{where} ModelConfig.{name}={getattr(self.model, name)} but the dataset's "
                                     f"{name} is {getattr(self.data, name)} (gemref.train.presets.preset_on_dataset sets it)")
            if self.model.max_len < self.data.max_len:
                raise UsageError(f"{where} ModelConfig.max_len={self.model.max_len} is shorter than the dataset's "
                                 f"longest history, {self.data.max_len} events")
        if self.train.batch_size > self.data.n_train:
            raise UsageError(f"TrainConfig.batch_size={self.train.batch_size} exceeds {where} "
                             f"n_train={self.data.n_train} (each step draws batch_size distinct training samples)")


def preset_on_dataset(preset: Preset, data: DatasetFolder, train: TrainConfig | None = None) -> Preset:
    """The preset's architecture (widths, heads, layers, FFN, attention) and training settings
    (or `train`, when given) on a dataset: vocab sizes, feature counts and max_len from the data. A preset that cannot hold
    the data is a UsageError naming the field: histories longer than the preset's max_len (the
    longest history its architecture is sized for), an attention window beyond the data's
    longest history, a batch larger than the train split."""
    arch = preset.model
    if data.max_len > arch.max_len:
        raise UsageError(f"dataset {data.folder}: its longest history is {data.max_len} events (manifest "
                         f"dataset.max_len), more than the {preset.name} preset's ModelConfig.max_len={arch.max_len}: "
                         f"choose a preset whose max_len is >= {data.max_len} "
                         f"({', '.join(n for n, p in PRESETS.items() if p.model.max_len >= data.max_len) or 'none'}) "
                         "or convert the data with shorter histories (gemref data movielens --max-history N)")
    if arch.window is not None and arch.window > data.max_len:
        raise UsageError(f"dataset {data.folder}: ModelConfig.window={arch.window} of the {preset.name} preset is "
                         f"longer than the dataset's longest history ({data.max_len} events): it would be full "
                         "attention; choose a smaller --attention-window")
    model = replace(arch, max_len=data.max_len, **{name: getattr(data, name) for name in DATA_FIELDS})
    return replace(preset, model=model, data=data, train=train or preset.train)


PRESETS: dict[str, Preset] = {
    # Seconds on a laptop CPU: tests and CI.
    "tiny": Preset(
        "tiny",
        ModelConfig(d_model=32, n_heads=2, n_layers=2, ffn_mult=2, max_len=64, item_vocab=2000,
                    action_vocab=4, time_buckets=16, sparse_vocab=(50, 200, 1000, 100),
                    n_dense=8, fm_rank=4),
        DataConfig(n_train=24_576, n_eval=4096, shard_rows=4096, median_len=12, len_sigma=0.9),
        TrainConfig(batch_size=64, steps=300, lr=3e-3),
    ),
    # The CPU demo: long histories with a skewed length profile, a few seconds per step.
    "small": Preset(
        "small",
        ModelConfig(d_model=64, n_heads=4, n_layers=3, ffn_mult=2, max_len=512, item_vocab=20_000,
                    action_vocab=6, time_buckets=32,
                    sparse_vocab=(100, 1000, 10_000, 500, 2000, 50, 5000, 300),
                    n_dense=16, fm_rank=8),
        DataConfig(n_train=16_384, n_eval=2048, shard_rows=4096, median_len=40, len_sigma=1.1),
        TrainConfig(batch_size=64, steps=100, lr=2e-3),
    ),
    # Fills one GPU (H100/H200) in bf16.
    "base": Preset(
        "base",
        ModelConfig(d_model=512, n_heads=4, n_layers=6, ffn_mult=4, max_len=2048,
                    item_vocab=1_000_000, action_vocab=8, time_buckets=64,
                    sparse_vocab=(1000, 10_000, 100_000, 1_000_000, 5000, 50_000, 200, 20_000,
                                  100_000, 3000, 500_000, 1000, 40_000, 80, 7000, 250_000),
                    n_dense=64, fm_rank=16),
        DataConfig(n_train=262_144, n_eval=16_384, shard_rows=16_384, median_len=160, len_sigma=1.1),
        TrainConfig(batch_size=256, steps=200, lr=1e-3),
    ),
    # Multi-GPU scale (FSDP); the shape used by the scale projection.
    "large": Preset(
        "large",
        ModelConfig(d_model=1024, n_heads=8, n_layers=12, ffn_mult=4, max_len=4096,
                    item_vocab=10_000_000, action_vocab=8, time_buckets=64,
                    sparse_vocab=tuple([1_000_000] * 8 + [100_000] * 16 + [10_000] * 8),
                    n_dense=128, fm_rank=32),
        DataConfig(n_train=1_048_576, n_eval=32_768, shard_rows=32_768, median_len=300, len_sigma=1.2),
        TrainConfig(batch_size=512, steps=500, lr=5e-4),
    ),
}


def dataset_preset(preset: Preset | str, folder: str | Path | None, train: TrainConfig | None = None) -> Preset:
    """The preset (a name or a Preset) on the dataset in `folder` (its manifest checked:
    gemref/data/folder.py `open_dataset`), with `train` in place of its TrainConfig when given
    (checked against the dataset's train split, not the preset's own data); the preset itself
    when folder is None."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    if folder is None:
        return preset if train is None else replace(preset, train=train)
    from ..data.folder import open_dataset      # numpy: only a run on a dataset folder needs it

    return preset_on_dataset(preset, open_dataset(folder), train)


def get_preset(name: str) -> Preset:
    """Look up a preset by name; unknown names raise UsageError listing the valid ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}") from None
