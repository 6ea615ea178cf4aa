"""Scale projection: step time and MFU of each ladder rung at 8 ... 4096 GPUs (weak scaling).

This is a model, not a measurement. Per rung and GPU count W, with b samples per GPU, the
step-time model of gemref/simulate/step_model.py:

    step_s  = compute_s x imbalance + exposed_comm_s
    E2E MFU = local MFU x scaling ratio,   scaling ratio = compute_s / step_s

the same two factors the waterfall measures (gemref/waterfall/stats.py).

* local MFU, and compute_s = mean per-GPU model FLOPs / (bf16 peak x local MFU): an INPUT,
  measured (a waterfall's local MFU per rung, gemref/simulate/summary.py, carried to the
  projected GPU as it is and labelled with where it was measured), given, or by default
  ASSUMED = efficiency x speed-up x model/executed FLOPs. The efficiency and speed-up are
  the assumptions (RungModel; each rung's values in the ladder table,
  gemref/waterfall/ladder.py `projection`); model/executed comes from gemref/mfu/flops.py on a
  sample of the preset's lengths (padding, materialised attention, recompute: computed).
* scaling ratio: from the model, what survives the imbalance and the exposed communication.
* imbalance: max/mean per-rank model FLOPs of global batches of W x b lengths drawn from
  the preset's length profile, priced with `sample_cost_coefficients` and split with the
  rung's policy by gemref/measure/balance_compare.py `compare` (the one comparison): round robin (equal counts) before the load-balance
  rung, kk after it (lpt when n x R > KK_WORK: kk's extra seconds buy < 1e-5 there). A
  padded sample costs the same whatever its length: only counts can differ.
* comm: every collective of one rank's step (gemref/parallel/volume.py, history events per
  rank at the profile's mean, routing balanced; the embedding all-to-alls fused across tables,
  one per direction, as TorchRec does) priced with NCCL's algorithm choices on two tiers
  (gemref/simulate/collectives.py: ring, tree, PAT, all-to-all peers in flight at once; NVLink in
  a node, the node's share of the traffic on each GPU's NIC between nodes), latency and
  bandwidth seconds apart (`comm_latency_s`, `comm_bandwidth_s`). Layouts:
  "replicated" (W x 1: every unit, tables included, all-reduced: gemref's baseline) and
  "fsdp_2d" ((W/S) x S, S = GPUs per node: FSDP in a node, HSDP across, tables row-sharded
  in the node and replicated across nodes).
* exposed comm (ASSUMPTION): a layer unit's collectives overlap the neighbouring layer's
  compute (FSDP prefetches the next gather and reduces asynchronously); the root unit's
  and the table replicas' collectives sit at the start or the end of the step with nothing
  to hide under, and the embedding all-to-alls are on the forward's critical path: exposed.
  Overlap hides at most the step's compute.
* SM contention: an overlapped collective holds k of the GPU's SMs and slows the compute
  under it by k / SM count (step_model.py). Options.transport sets k per collective kind
  (cost_model.TRANSPORTS: "nccl" 24, "ncclx_smfree" 1 for the collectives that only move
  bytes); `collective_sms` sets one k for every kind, `sm_share` the share directly.
* table replicas: priced as gemref's code runs them (gemref/parallel/rowwise.py, sparse.py), and
  every row names its `table_optimizer` and `table_sync_every`: "adamw" (the default) all-reduces
  the held table rows' summed gradient every step; "rowwise_adagrad" averages the replicas' weights
  and row state (d + 1 values per row) every `table_sync_every` K steps (1/K per step), as
  TorchRec's DMPCollection does; "rowwise_adam" likewise with its larger state (2d + 1 values per
  row: its first moment is per element). AdamW with K > 1 is refused: the code does not run it.
* fits: parameters + gradients + optimizer state per rank (parallel/memory.py
  `projected_rank_bytes`) below the GPU's memory; activations are not counted. The dense layers
  keep AdamW's two fp32 moments; the tables' state follows `table_optimizer` (adamw 2 x rows x d
  x 4 B, rowwise_adagrad rows x 4 B, rowwise_adam rows x (d + 1) x 4 B: what rowwise.py holds),
  and row-wise tables keep no gradient (rowwise.py steps their rows inside the backward). Until
  2026-12-06 every table optimizer was counted as AdamW, overstating row-wise tables' state.
  state_gb and memory_gb are decimal GB (1e9 bytes; 1 GiB = 1.074 GB).

Not modelled: activation memory, congestion, NCCL's protocols and NVLink SHARP, stragglers other
than load imbalance, data loading, pipelined embedding lookups. What dominates the result: the
local MFU (an input), the batch per GPU, the inter-node bandwidth, the table replicas'
synchronisation and the overlap. gemref/simulate/validate.py checks the formula against
measured multi-rank CPU runs.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from ..balance import SampleCost
from ..measure.balance_compare import compare
from ..parallel.config import MeshShape
from ..train.presets import Preset
from ..data.synthetic import draw_lengths
from ..waterfall.ladder import RUNGS
from ..mfu.flops import executed_flops, model_flops, sample_cost_coefficients
from ..mfu import meter
from ..mfu.peak import gpu_peak
from ..parallel.memory import projected_rank_bytes
from .collectives import SCHEDULES
from .cost_model import KINDS, HardwareProfile, get_profile
from .step_model import check_table_sync, comm_rows, comm_split, predict_step, step_collectives, with_sm_shares

GPU_COUNTS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
GEM_MFU_BAND = (0.20, 0.25)   # Meta, GEM announcement (2025): end-to-end training MFU, thousands of GPUs
# Meta's 2026 write-up of GEM's training: NCCLX's SM-free all-gather (24 SMs -> 1) gave ~5% end-to-end
# QPS, where compute/communication SM contention had cost up to 15%.
GEM_SMFREE_QPS_GAIN = 0.05
GEM_SM_CONTENTION_MAX = 0.15
KK_WORK = 200_000             # n x R above which the projection partitions with lpt instead of kk
DRAW_SAMPLES = 1 << 18        # a global batch this large is drawn once per GPU count
# GPU memory (bytes) for the "fits" column; datasheets.
GPU_MEMORY = {"H100": 80e9, "H200": 141e9, "B200": 180e9}


@dataclass(frozen=True)
class RungModel:
    """What a rung changes in the projection. Fields marked ASSUMED are inputs, not measurements."""

    key: str
    title: str
    padded: bool = True             # histories padded to max_len
    attention: str = "reference"    # reference (materialised) | fused (flash / Triton GDPA)
    efficiency: float = 0.35        # ASSUMED: share of the bf16 peak the executed FLOPs reach on one GPU (eager)
    recompute: float = 0.0          # ASSUMED: recomputed FLOPs / model FLOPs (activation checkpointing)
    batch_scale: float = 1.0        # ASSUMED: per-GPU batch multiple (AutoAC spends freed memory on it)
    compute_speedup: float = 1.0    # ASSUMED: float8 GEMMs' speed-up of the whole step's compute
    policy: str = "round_robin"     # how a global batch is split across ranks
    layout: str = "replicated"      # replicated | fsdp_2d
    gather_bytes: int = 2           # bytes per parameter in FSDP all-gathers (bf16; 1 with float8 all-gather)


def _ladder() -> list[RungModel]:
    """One RungModel per rung of gemref/waterfall/ladder.py: the rung before's, with the fields
    the ladder table's `projection` column sets."""
    out, rung = [], None
    for spec in RUNGS:
        rung = replace(rung or RungModel(spec.key, spec.title), key=spec.key, title=spec.title, **spec.projection)
        out.append(rung)
    return out


LADDER: list[RungModel] = _ladder()


@dataclass(frozen=True)
class Options:
    hardware: str | HardwareProfile = "h100_ib_ndr"
    batch_per_gpu: int | None = None     # None: the preset's batch size
    batches: int = 3                     # global batches drawn per GPU count (median imbalance); one
                                         # when a global batch holds > DRAW_SAMPLES samples
    shard_group: int | None = None       # fsdp_2d shard group S (None: GPUs per node)
    table_optimizer: str = "adamw"       # tables' optimizer: adamw (summed gradient all-reduce every step) |
                                         # rowwise_adagrad | rowwise_adam (weights + row state averaged every K steps)
    table_sync_every: int = 1            # table replica sync every K steps (row-wise optimizers only)
    transport: str = "nccl"              # SMs each collective kind holds (cost_model.TRANSPORTS): nccl | ncclx_smfree
    collective_sms: int | None = None    # what-if: SMs every collective holds, 0..SM count (overrides transport)
    sm_share: float | None = None        # what-if: share of overlapped compute lost, [0, 1] (overrides both)
    bandwidth_scale: float = 1.0         # multiplies every link's bandwidth (sensitivity)
    schedule: str = "nccl"               # multi-node groups: nccl | hierarchical | flat (collectives.price)
    seed: int = 0


def hardware_of(options: Options) -> HardwareProfile:
    hw = get_profile(options.hardware) if isinstance(options.hardware, str) else options.hardware
    if not options.bandwidth_scale > 0:
        raise ValueError(f"bandwidth_scale must be > 0, got {options.bandwidth_scale}")
    if options.bandwidth_scale != 1.0:
        scale = lambda t: replace(t, bandwidth_bytes_per_s=t.bandwidth_bytes_per_s * options.bandwidth_scale)  # noqa: E731
        hw = replace(hw, intra=scale(hw.intra), inter=scale(hw.inter))
    return hw


def check_mfu(value: float, what: str) -> float:
    if not (isinstance(value, (int, float)) and 0 < value <= 1):
        raise ValueError(f"{what}: MFU must be in (0, 1], got {value!r}")
    return float(value)


def local_mfu(preset: Preset, ladder: list[RungModel], given: dict[str, tuple[float, str]] | None = None,
              sample: int = 2048, seed: int = 0) -> dict[str, tuple[float, str]]:
    """{rung key: (local MFU: one GPU's compute-only rate, its source)}: `given` entries win,
    else efficiency x speed-up x model/executed."""
    given = given or {}
    cfg, data = preset.model, preset.data
    lengths = draw_lengths(data.length_profile, sample, cfg.max_len, min(data.median_len, cfg.max_len),
                           data.len_sigma, seed)
    model = model_flops(cfg, lengths).total
    fused = "sdpa" if cfg.activation == "softmax" else "triton"
    out = {}
    for r in ladder:
        if r.key in given:
            out[r.key] = (check_mfu(given[r.key][0], r.key), given[r.key][1])
            continue
        kernel = fused if r.attention == "fused" else "reference"
        executed = executed_flops(cfg, lengths, jagged=not r.padded, kernel=kernel).total + r.recompute * model
        mfu = min(1.0, r.efficiency * r.compute_speedup * model / executed)
        out[r.key] = (mfu, f"assumed: efficiency {r.efficiency:g} x speed-up {r.compute_speedup:g} "
                           f"x model/executed {model / executed:.3f}")
    return out


def draw_batches(preset: Preset, n: int, batches: int, seed: int) -> list[np.ndarray]:
    """`batches` global batches of n history lengths from the preset's length profile."""
    data, cfg = preset.data, preset.model
    rng = np.random.default_rng(seed)
    return [draw_lengths(data.length_profile, n, cfg.max_len, min(data.median_len, cfg.max_len), data.len_sigma, rng)
            for _ in range(batches)]


@functools.lru_cache(maxsize=256)
def load_stats(preset: Preset, gpus: int, batch: int, policy: str, padded: bool, batches: int, seed: int) -> dict:
    """Median imbalance (max/mean rank cost) over drawn global batches of gpus x batch samples, and
    the mean per-rank model FLOPs. A padded sample costs the same whatever its length."""
    cost = SampleCost(*sample_cost_coefficients(preset.model))
    n_draws = batches if gpus * batch <= DRAW_SAMPLES else 1
    steps = np.stack(draw_batches(preset, gpus * batch, n_draws, seed + gpus))
    if policy == "kk" and gpus * batch * gpus > KK_WORK:
        policy = "lpt"
    split_by = (lambda lengths: np.ones(len(lengths))) if padded else cost
    row = compare(steps, split_by, gpus, [policy], min_per_rank=1)[0]
    return {"imbalance": row["imbalance"], "rank_flops": float(cost.cost(steps.ravel()).sum() / (gpus * n_draws))}


def mesh_for(rung: RungModel, gpus: int, hw: HardwareProfile, shard_group: int | None) -> MeshShape:
    if rung.layout == "replicated":
        return MeshShape(gpus, 1)
    S = min(gpus, shard_group or hw.gpus_per_node)
    if gpus % S:
        raise ValueError(f"gpus={gpus} is not a multiple of the shard group {S} (GPUs per node)")
    return MeshShape(gpus // S, S)


@functools.lru_cache(maxsize=64)
def state_bytes(cfg, shard: int, sparse: str, table_optimizer: str = "adamw") -> int:
    """Parameters + gradients + optimizer state (the tables' by `table_optimizer`) on the fullest
    rank (parallel/memory.py; depends on S only)."""
    return projected_rank_bytes(cfg, MeshShape(1, shard), sparse, table_optimizer=table_optimizer)["total"]


def check_gpus(gpus) -> list[int]:
    out = []
    for i, w in enumerate(gpus):
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
            raise ValueError(f"gpus[{i}]={w!r}: GPU counts must be integers >= 1")
        out.append(int(w))
    if not out:
        raise ValueError("gpus is empty: give at least one GPU count")
    return out


def project(preset: Preset, gpus=GPU_COUNTS, *, options: Options = Options(), ladder: list[RungModel] | None = None,
            mfu: dict[str, tuple[float, str]] | None = None) -> list[dict]:
    """One row per (GPU count, rung): compute, exposed comm per kind, imbalance, step time, MFU.

    `mfu` {rung key: (local MFU, source)} overrides the assumed values (see module doc).
    """
    gpus = check_gpus(gpus)
    ladder = ladder or LADDER
    hw = hardware_of(options)
    peak = gpu_peak(hw.gpu, "bf16")
    if peak.flops is None:
        raise ValueError(f"hardware {hw.name!r}: no bf16 peak for GPU {hw.gpu!r} in gemref/mfu/peak.py")
    if options.schedule not in SCHEDULES:
        raise ValueError(f"schedule={options.schedule!r}; valid: {', '.join(SCHEDULES)}")
    if options.batches < 1:
        raise ValueError(f"batches must be >= 1, got {options.batches}")
    if options.table_sync_every < 1:
        raise ValueError(f"table_sync_every must be >= 1, got {options.table_sync_every}")
    check_table_sync(options.table_optimizer, options.table_sync_every)
    base_batch = options.batch_per_gpu or preset.train.batch_size
    if base_batch < 1:
        raise ValueError(f"batch_per_gpu must be >= 1, got {base_batch}")
    with_sm_shares([{"kind": k} for k in KINDS], hw, options.transport, options.collective_sms,
                   options.sm_share)     # bad contention options fail here, before any work
    local = local_mfu(preset, ladder, mfu, seed=options.seed)
    mean_len = float(np.mean(draw_batches(preset, 4096, 1, options.seed)[0]))   # history events per sample
    memory = next((v for k, v in GPU_MEMORY.items() if k in hw.gpu), None)
    rows = []
    for W in gpus:
        for r in ladder:
            b = max(1, round(base_batch * r.batch_scale))
            st = load_stats(preset, W, b, r.policy, r.padded, options.batches, options.seed)
            mesh = mesh_for(r, W, hw, options.shard_group)
            sparse = "row" if r.layout == "fsdp_2d" else "none"
            tokens = round(b * mean_len)     # balanced routing: every rank at the mean
            coll = comm_rows(step_collectives(preset.model, mesh, b, tokens, not r.padded,
                                              r.gather_bytes, sparse, table_optimizer=options.table_optimizer), mesh, hw,
                             table_sync_every=options.table_sync_every, schedule=options.schedule)
            coll = with_sm_shares(coll, hw, options.transport, options.collective_sms, options.sm_share)
            m, source = local[r.key]
            compute_s = meter.seconds_at(st["rank_flops"], m, peak.flops)
            step = predict_step(compute_s, st["imbalance"], coll)
            state = state_bytes(preset.model, mesh.shard, sparse, options.table_optimizer)
            rows.append({"gpus": W, "rung": r.title, "key": r.key, "mesh": str(mesh), "batch_per_gpu": b,
                         "local_mfu": m, "local_mfu_source": source, "imbalance": st["imbalance"], **step,
                         **comm_split(coll),
                         "mfu": meter.mfu(st["rank_flops"], step["step_s"], peak.flops), "rank_flops": st["rank_flops"],
                         "peak_flops": peak.flops, "transport": options.transport,
                         "collective_sms": options.collective_sms, "sm_share": options.sm_share,
                         "table_optimizer": options.table_optimizer, "table_sync_every": options.table_sync_every,
                         "state_gb": state / 1e9, "memory_gb": None if memory is None else memory / 1e9,
                         "fits": None if memory is None else state < memory,
                         "collectives": coll})
    return rows
