"""TrainConfig on the command line: one option per field, derived from the dataclass.

Each field `foo_bar` becomes `--foo-bar VALUE`, parsed by the field's declared type
(gemref/config/values.py); a bool field becomes `--foo-bar/--no-foo-bar`. HELP and CHOICES below only
add words and valid values; every option defaults to the preset's value. `--set KEY=VALUE`
sets any field too (the same typed parsing), so scripts written against either form work.
"""
from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Callable

from ..config import (AC_COMPRESSIONS, AC_MODES, BACKENDS, BALANCE_POLICIES, EMBEDDING_ENGINES, PRECISION_KERNELS,
                      PRECISIONS, SPARSE_SHARDINGS, TORCHREC_SHARDINGS)
from ..config import TrainConfig, override
from ..errors import UsageError
from ..config.values import field_types, parse_as, parse_field
from ..options import output_dir, split_pairs


def _kernels() -> tuple[str, ...]:
    from ..attention import kernel_names      # imports torch: only when a training command is configured

    return kernel_names()


# field -> help (rung numbers: the ladder of docs/design.md)
HELP = {
    "batch_size": "samples per step: the global batch, split across ranks",
    "steps": "optimisation steps of the run, warm-up included",
    "lr": "AdamW learning rate",
    "weight_decay": "AdamW weight decay",
    "warmup_steps": "first steps left out of the timing (not an LR warm-up)",
    "eval_every": "evaluate every N steps (0: once at the end)",
    "eval_batches": "batches per evaluation",
    "seed": "seed of the model init and the batch order",
    "num_workers": "DataLoader worker processes",
    "jagged": "rung 1: keep histories jagged instead of padding to max_len",
    "kernel": "rung 2: gdpa kernel (jagged layout; auto picks the fastest that runs here)",
    "compile": "rung 3: torch.compile, block by block",
    "compile_regions": "with --compile: the region kinds to compile, comma-separated (the rest stay eager): all, or "
                       "sequence.project, sequence.mix, interaction, cross.project, cross.mix, loss",
    "ac": "rung 4: activation checkpointing (auto = AutoAC; pt2 = torch's activation_memory_budget, "
          "needs --compile)",
    "ac_budget": "auto/pt2: activation memory budget, a fraction in (0, 1] of the no-checkpoint bytes",
    "ac_compress": "rung 4: store saved activations as FP8/MX (with --ac none: every block; with --ac auto: "
                   "one more option per block)",
    "ac_plan": "with --ac auto: apply this solved plan instead of solving at setup (the record's "
               "ac_plan.summary, e.g. 'sequence:SF interaction:-- cross:F-')",
    "balance": "rung 5: split global batches across ranks by cost",
    "mesh": "rung 6: RxS mesh, R replica groups x S-way sharding (with --ranks N or torchrun: "
            "default 1xN, FSDP over all ranks)",
    "reshard_after_forward": "FSDP: free gathered parameters after forward (--no-...: keep them "
                             "for backward, more memory, less traffic)",
    "sparse_sharding": "rung 6: shard the embedding tables",
    "backend": "collectives (auto: nccl on cuda, gloo on cpu)",
    "checkpoint_dir": "write distributed checkpoints into this folder",
    "checkpoint_every": "save a checkpoint every N steps (0: never)",
    "resume": "continue from the newest checkpoint in --checkpoint-dir",
    "checkpoint_overwrite": "let a fresh run delete the checkpoints it finds in --checkpoint-dir (never with --resume)",
    "precision": "rung 7: Linear GEMM precision (auto: fp32 on CPU, bf16 on CUDA)",
    "precision_kernel": "float8/MXFP8 GEMM path",
    "precision_min_dim": "Linear layers with min(in, out) below this stay in high precision",
    "embeddings": "embedding engine: native tables, or TorchRec's EmbeddingCollection/EmbeddingBagCollection "
                  "(sharded by DistributedModelParallel with --ranks)",
    "torchrec_sharding": "with --embeddings torchrec and ranks: auto (TorchRec's planner) or one sharding type "
                         "for every table (table_row_wise: the bag tables; sequence tables then row_wise)",
    "torchrec_2d": "with --embeddings torchrec and --mesh RxS (R, S >= 2): TorchRec's 2D sparse parallel "
                   "(DMPCollection): tables sharded over each S-rank row of the mesh, replicated over the R rows, "
                   "replicas averaged after every step; CUDA only",
}
CHOICES: dict[str, Callable[[], tuple[str, ...]]] = {
    "kernel": _kernels,
    "precision": lambda: ("auto",) + PRECISIONS,
    "precision_kernel": lambda: PRECISION_KERNELS,
    "ac": lambda: AC_MODES,
    "ac_compress": lambda: AC_COMPRESSIONS,
    "balance": lambda: BALANCE_POLICIES,
    "sparse_sharding": lambda: SPARSE_SHARDINGS,
    "backend": lambda: BACKENDS,
    "embeddings": lambda: EMBEDDING_ENGINES,
    "torchrec_sharding": lambda: TORCHREC_SHARDINGS,
}
CHECKPOINT_FIELDS = ("checkpoint_dir", "checkpoint_every", "resume", "checkpoint_overwrite")   # `train` only


def _typed(tp) -> Callable[[str], object]:
    def parse(text: str):
        try:
            return parse_as(tp, text)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = tp.__name__ if isinstance(tp, type) else str(tp)
    return parse


def add_train_switches(p: argparse.ArgumentParser, *, checkpoints: bool = False) -> None:
    """One option per TrainConfig field (checkpoint fields only with `checkpoints`), and --set."""
    group = p.add_argument_group("training switches (TrainConfig fields; default: the preset's)")
    for name, tp in field_types(TrainConfig).items():
        if name in CHECKPOINT_FIELDS and not checkpoints:
            continue
        flag = "--" + name.replace("_", "-")
        if tp is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=HELP[name])
        elif name in CHOICES:
            group.add_argument(flag, choices=CHOICES[name](), default=None, help=HELP[name])
        else:
            kind = output_dir if name == "checkpoint_dir" else _typed(tp)
            group.add_argument(flag, type=kind, default=None, metavar=name.upper(), help=HELP[name])
    group.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="set a TrainConfig field by name, e.g. lr=0.001 (typed as the field)")


def train_changes(args: argparse.Namespace) -> dict:
    """{field: value} of every TrainConfig field given as an option or by --set."""
    changes = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name, None) is not None}
    for name, text in split_pairs(args.set, "--set").items():
        if name in changes:
            raise UsageError(f"{name} given both as --{name.replace('_', '-')} and by --set")
        changes[name] = parse_field(TrainConfig, name, text)
        if name in CHOICES and changes[name] not in CHOICES[name]():
            raise UsageError(f"--set {name}={text}: valid: {', '.join(CHOICES[name]())}")
    return changes


def train_config_from_args(args: argparse.Namespace, base: TrainConfig) -> TrainConfig:
    """`base` with every field given on the command line (UsageError on a bad value)."""
    return override(base, **train_changes(args))
