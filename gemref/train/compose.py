"""Where the efficiency switches compose: a TrainConfig becomes a model, an optimizer, data and a sampler.

`build_model` applies the switches from outside the model in torchtitan's order (precision,
activation checkpointing, compile, then sharding: tables, then FSDP); nothing else in gemref
applies them (the waterfall, the benches and the chapters build models through here). The
kernel is resolved once, here (`auto` -> the concrete kernel the model then calls); AutoAC is
solved once, at the batch each rank runs, unless the config carries its plan (`ac_plan`).
`setup` adds the data (gemref's generated cache, or a dataset folder from outside, only
read), the optimizer and this rank's batch sampler, and
returns the `Setup` the training loop (gemref/train/loop.py), the waterfall and the benches
step. Default dtype: fp32 on CPU, bf16 autocast with fp32 master weights on CUDA; `precision`
selects float8/MXFP8.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..attention import resolve_model_kernel
from ..attention.triton.variant import current_variant
from ..balance import SampleCost, loss_divisor
from ..compile import compile_model, gemref_regions
from ..data.config import DatasetFolder
from .presets import Preset, get_preset
from .config import TrainConfig
from ..data.jagged import JaggedBatch
from ..data.loader import EventDataset, make_loader
from ..data.manifest import verified_shards
from ..data.sampler import BalancedDistributedBatchSampler
from ..data.shards import dataset_dir, ensure_dataset, shard_paths
from ..env import resolve_device
from ..errors import UsageError
from ..mfu.flops import sample_cost_coefficients, step_flops
from ..mfu.timing import PendingStep, StepRecord, timed_step
from ..model.gem import GEMRef, ranking_loss
from ..parallel.parallelize import ParallelState, parallel_state, parallelize
from ..precision.apply import PrecisionReport, apply_precision
from ..step import backward, forward_loss, train_step

@dataclass
class Setup:
    """What a run needs besides the loop: model, optimizer, data, device facts."""

    preset: Preset
    train: TrainConfig
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    train_set: EventDataset
    eval_set: EventDataset
    kernel: str                   # the concrete gdpa kernel (auto resolved)
    precision: PrecisionReport    # what the precision switch converted, autocast dtype
    sampler: BalancedDistributedBatchSampler   # this rank's part of every global batch
    parallel: ParallelState | None = None   # mesh and rank; None in one plain process

    @property
    def rank(self) -> int:
        return self.parallel.rank if self.parallel else 0

    @property
    def world(self) -> int:
        return self.parallel.world if self.parallel else 1

    @property
    def normalizer(self) -> int | None:
        """What every rank divides its summed loss by (`gemref.balance.loss_divisor`: the global batch,
        gradients being summed over ranks); None in one process (the batch's own size)."""
        return loss_divisor(self.train.batch_size, self.world, "sum") if self.parallel else None

    def loss(self, batch: JaggedBatch) -> Tensor:
        """This run's forward loss on a batch (on the run's device)."""
        return forward_loss(self.model, batch, self.precision.autocast_dtype, self.normalizer)

    def gradients(self, batch: JaggedBatch) -> None:
        """Forward and backward only, gradients left in place (to measure memory or communication)."""
        self.optimizer.zero_grad(set_to_none=True)
        backward(self.model, self.loss(batch), self.parallel.finish_backward if self.parallel else None)

    def step(self, batch: JaggedBatch) -> Tensor:
        """One training step of this run (gemref/step.py); the detached loss, on the device."""
        return train_step(self.model, self.optimizer, batch, autocast_dtype=self.precision.autocast_dtype,
                          normalizer=self.normalizer,
                          finish_backward=self.parallel.finish_backward if self.parallel else None,
                          after_optimizer_step=self.after_optimizer_step)

    def after_optimizer_step(self, model: nn.Module) -> None:
        """The precision switch's (float8 scales) and, under torchrec_2d, the table replicas' sync."""
        self.precision.after_optimizer_step(model)
        if self.train.embedding_tables.torchrec_2d:
            from ..interop.sharders import sync_replicas   # TorchRec is optional: imported only on use
            sync_replicas(model)

    def flops(self, lengths: Tensor):
        """This run's FLOP accounting of a step on batches of these lengths (gemref/mfu/flops.py)."""
        ac_choices = {}
        if wraps_blocks(self.train):   # AutoAC: loaded only by a run whose blocks it wrapped
            from ..autoac import applied_plan
            ac_choices = applied_plan(self.model)
        return step_flops(self.preset.model, lengths, jagged=self.train.attention.jagged, kernel=self.kernel,
                          ac_choices=ac_choices, device=self.device)

    def timed_step(self, fetch, *, op_classes: bool = False, defer: bool = False,
                   after: PendingStep | None = None) -> tuple[StepRecord | PendingStep, Tensor, JaggedBatch]:
        """One timed training step on the batch `fetch()` returns (gemref/mfu/timing.py timed_step;
        `defer`, `after`: a record read later, the loop's overlap)."""
        return timed_step(fetch, lambda b: self.step(b.to(self.device, non_blocking=True)), self.device,
                          self.flops, op_classes=op_classes, defer=defer, after=after)


def wraps_blocks(train: TrainConfig) -> bool:
    """Whether `build_model` wraps blocks with AutoAC's checkpointing (ac full or auto) or compression."""
    ac = train.activation_checkpoint
    return ac.mode in ("full", "auto") or ac.compress != "none"


def resolve_precision(train: TrainConfig, device: torch.device) -> str:
    """The precision a run uses: `auto` is fp32 on CPU and bf16 autocast on CUDA."""
    recipe = train.mixed_precision.recipe
    return recipe if recipe != "auto" else "bf16" if device.type == "cuda" else "fp32"


def build_model(preset: Preset, train: TrainConfig, device: torch.device,
                parallel: ParallelState | None = None) -> tuple[nn.Module, str, PrecisionReport]:
    """GEMRef with the switches applied (model-level switches first, sharding last); returns
    it, the concrete attention kernel and the precision report. AutoAC without a given plan
    is solved here on a batch shaped like the preset's data, of the size each rank runs."""
    attention, ac, tables = train.attention, train.activation_checkpoint, train.embedding_tables
    per_rank = max(1, train.batch_size // (parallel.world if parallel else 1))
    precision = resolve_precision(train, device)
    # the dtype attention sees: bf16 under bf16 autocast (CUDA's default, CPU's "bf16"), else fp32
    dtype = torch.bfloat16 if precision == "bf16" or (device.type == "cuda" and precision != "fp32") else torch.float32
    cfg = preset.model
    kernel = resolve_model_kernel(attention.kernel, device, dtype, cfg.n_heads, cfg.head_dim, cfg.activation,
                                  cfg.window) if attention.jagged else "reference"
    torch.manual_seed(train.seed)
    model = GEMRef(cfg, jagged=attention.jagged, kernel=kernel).to(device)
    report = apply_precision(model, precision, device=device, kernel=train.mixed_precision.kernel,
                             min_dim=train.mixed_precision.min_dim)
    if device.type == "cpu":   # CPU-only speed work, out of a GPU trainer's path: each Linear GEMM on the
        from ..precision.fast_linear import use_fastest_cpu_gemms   # fastest measured path, in its dtype
        use_fastest_cpu_gemms(model, device, "bf16" if report.autocast_dtype == torch.bfloat16 else "fp32")
    compression = None
    if wraps_blocks(train):   # AutoAC: loaded only when a run turns it on
        from ..autoac import apply_plan, auto_checkpoint, parse_plan
        from ..activation_compression import CompressionSpec
        compression = CompressionSpec(ac.compress) if ac.compress != "none" else None
    if compression is not None and cfg.activation == "softmax":   # a compressed block compresses its attention too
        raise UsageError("ac_compress stores attention's saved q, k, v and O in E4M3, which softmax attention's "
                         "backward amplifies (gemref/activation_compression.py): use a pointwise activation or "
                         "ac_compress none")
    blocks = model.checkpoint_blocks()          # AutoAC's candidates: GEMRef names its own blocks
    if ac.mode == "full":
        apply_plan(model, {name: "full" for name in blocks})
    elif ac.mode == "auto" and ac.plan:          # planned already (e.g. by the waterfall, once per rung)
        apply_plan(model, parse_plan(ac.plan, blocks), compression=compression)
    elif ac.mode == "auto":                      # profiled eagerly at the batch this rank runs
        from ..data.batches import representative_batch   # a batch of chosen lengths: only to profile
        batch = representative_batch(preset.model, preset.data, per_rank, device, seed=train.seed)
        options = ("full",) if train.compilation.enabled else ("save_matmuls", "full")
        auto_checkpoint(model, blocks, lambda: forward_loss(model, batch, report.autocast_dtype), ac.budget,
                        options=options + (("compressed",) if compression else ()), compression=compression,
                        inputs=batch.tensors())
    elif compression is not None:   # no checkpointing: every block keeps its saved activations compressed
        apply_plan(model, {name: "compressed" for name in blocks}, compression=compression)
    if train.compilation.enabled:
        kinds = train.compilation.region_kinds    # GEMRef's kinds, named for compile_model
        compile_model(model, gemref_regions(model, kinds), loss=ranking_loss if "loss" in kinds else None,
                      activation_memory_budget=ac.budget if ac.mode == "memory_budget" else None)
    if tables.engine == "torchrec":   # TorchRec's tables (sharded by DMP over the ranks), gemref's dense layers
        from ..interop.sharders import use_torchrec_tables   # TorchRec is optional: imported only on use
        use_torchrec_tables(model, lr=train.lr, sharding=tables.torchrec_sharding, batch_size=per_rank,
                            two_d_shard=parallel.shape.shard if tables.torchrec_2d and parallel else None)
    if parallel is not None:
        parallelize(model, parallel, device, layers=[f"layers.{i}" for i in range(len(model.layers))],
                    tables=[f"tables.{name}" for name in model.tables] if tables.engine != "torchrec" else (),
                    ignored=model.tables if tables.engine == "torchrec" else None, features=_gem_lookups(model),
                    param_dtype=fsdp_param_dtype(report, device))
    return model, kernel, report


def fsdp_param_dtype(report: PrecisionReport, device: torch.device) -> torch.dtype:
    """The dtype FSDP gathers parameters in: on CUDA the one the GEMMs compute in (bf16 under bf16 or
    float8's autocast, fp32 in an fp32 run); on CPU fp32 (autocast, or the bf16 GEMM path of
    precision/fast_linear.py, casts the fp32 weights itself)."""
    return (report.autocast_dtype or torch.float32) if torch.device(device).type == "cuda" else torch.float32


def _gem_lookups(model: GEMRef):
    """GEMRef's table calls per forward, in order (GEMRef.embed): all of them in one fused exchange."""
    def features(batch: JaggedBatch) -> dict[str, list[Tensor]]:
        batch.check_model_inputs(model.cfg)     # bad ids are named before they are routed
        ids = batch.values
        out = {"tables.item": [ids[:, 0], batch.ad_ids], "tables.action": [ids[:, 1]],
               "tables.time_gap": [ids[:, 2]], "tables.position": [model.layout(batch).row_position]}
        out.update({f"tables.sparse_{f}": [batch.sparse_ids[:, f]] for f in range(batch.sparse_ids.shape[1])})
        return out
    return features


def make_optimizer(model: nn.Module, train: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; embedding tables get no weight decay (rows a batch does not touch keep their values),
    or with table_optimizer='rowwise_adagrad' / 'rowwise_adam' a RowWiseAdagrad / RowWiseAdam attached
    to them at their own rate, table_lr (stepped inside backward, gemref/parallel/rowwise.py); TorchRec's tables are left to its own optimizer (gemref/interop/tables.py).

    The fused implementation (one kernel over all parameters of a group) where every
    parameter is floating point on CPU or CUDA: on CPU torch's default is a Python loop of
    ~10 ops per parameter, and fused matches it within fp32 rounding (tests/test_optimizer.py;
    `gemref bench step_profile` shows the optimizer's share of a step). Elsewhere torch's default."""
    engine: set[int] = set()
    if train.embedding_tables.engine == "torchrec":   # TorchRec's tables: updated by its own optimizer
        from ..interop.tables import engine_parameters
        engine = engine_parameters(model)
    params = [(n, p) for n, p in model.named_parameters() if id(p) not in engine]
    tables = [p for n, p in params if n.startswith("tables.")]
    dense = [p for n, p in params if not n.startswith("tables.")]
    if train.parallelism.table_optimizer != "adamw":   # tables step inside backward (parallel/rowwise.py)
        from ..parallel.rowwise import ROW_OPTIMIZERS   # loaded only when the tables use one
        ROW_OPTIMIZERS[train.parallelism.table_optimizer](model.tables, lr=train.parallelism.table_lr,
                                                          sync_interval=train.parallelism.table_sync_interval)
        params, tables = [(n, p) for n, p in params if not n.startswith("tables.")], []
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for _, p in params)
    return torch.optim.AdamW([{"params": dense, "weight_decay": train.weight_decay},
                              {"params": tables, "weight_decay": 0.0}], lr=train.lr, fused=fused or None)


def batch_sampler(lengths, preset: Preset, train: TrainConfig, rank: int, world: int) -> BalancedDistributedBatchSampler:
    """This rank's part of every global batch (drop_last: every step has the full global batch)."""
    policy = "round_robin" if train.balancing.policy == "none" else train.balancing.policy
    cost = SampleCost(*sample_cost_coefficients(preset.model))
    return BalancedDistributedBatchSampler(lengths, train.batch_size, cost, rank=rank, world_size=world,
                                           seed=train.seed, policy=policy, drop_last=True)


def datasets(preset: Preset, data_root: str | Path | None = None,
             progress: bool = False) -> tuple[EventDataset, EventDataset]:
    """The preset's (train, eval) data: a dataset folder from outside (`DatasetFolder`, from
    `--dataset`) is verified and read, never regenerated nor written; a synthetic `DataConfig`
    is gemref's own cache, generated or reused under `data_root`."""
    if isinstance(preset.data, DatasetFolder):
        from ..data.folder import check_lengths, check_unchanged   # a dataset folder from outside: only then
        check_unchanged(preset.data)
        folder = preset.data.folder
        sets = tuple(EventDataset(verified_shards(folder, split, remember=False), preset.model)
                     for split in ("train", "eval"))
        check_lengths(preset.data, sets[0].lengths)
        return sets
    folder = dataset_dir(preset.name, preset.model, preset.data, data_root)
    ensure_dataset(preset.model, preset.data, folder, progress=progress)
    return EventDataset(shard_paths(folder, "train"), preset.model), EventDataset(shard_paths(folder, "eval"), preset.model)


def setup(preset: Preset | str, train: TrainConfig | None = None, *, device: str = "auto",
          data_root: str | Path | None = None, progress: bool = False) -> Setup:
    """A run's Setup: the preset's data (`datasets`), the model with the switches applied
    (`build_model`), AdamW and this rank's batch sampler."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    train = train or preset.train
    current_variant()        # GEMREF_GDPA checked before any work (resolve_device checks the other knobs)
    parallel, dev = parallel_state(train.parallelism, resolve_device(device))
    train_set, eval_set = datasets(preset, data_root, progress)
    model, kernel, precision = build_model(preset, train, dev, parallel)
    rank, world = (parallel.rank, parallel.world) if parallel else (0, 1)
    return Setup(preset, train, dev, model, make_optimizer(model, train), train_set, eval_set,
                 kernel, precision, batch_sampler(train_set.lengths, preset, train, rank, world), parallel)


def sample_batch(s: Setup) -> JaggedBatch:
    """The first training batch of the run's seed, on the run's device (for one-off measurements)."""
    return next(iter(make_loader(s.train_set, s.train.batch_size, seed=s.train.seed))).to(s.device)
