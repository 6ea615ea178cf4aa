"""The one step-time model: a rank's step from its compute, the load imbalance and its collectives.

    step = compute x imbalance + exposed comm + SM slowdown of the overlapped compute

* compute: seconds of one rank's work at its local MFU (model FLOPs / (peak x local MFU)).
* imbalance: max/mean rank work; every rank waits for the slowest at the next collective.
* comm: every collective of the step (gemref/parallel/volume.py) priced with NCCL's algorithm
  choices on two tiers (collectives.py, cost_model.price_group): each row carries its
  `latency_s` and `bandwidth_s` apart and the `algorithm`. The embedding all-to-alls are fused
  across tables, one per direction (`fuse_all_to_alls`, as TorchRec's input and output dists
  do). A row's `overlappable_s` is the part that can run under compute:
  the layer units' FSDP gathers and reduce-scatters (prefetched, reduced asynchronously).
  The root unit's and the table replicas' collectives and the embedding all-to-alls have
  nothing to hide under: exposed.
* SM contention: a collective holding k of the GPU's N SMs (cost_model.sm_share, by
  transport: NCCL's kernels 24, NCCLX's SM-free transport 1) leaves the compute it overlaps
  N - k of them, so compute runs at rate 1 - s (s = k/N) while it is overlapped. With O
  seconds overlappable, D = sum of O_i x s_i of the compute's work lost under them, and
  B = compute x imbalance:
      B >= O - D (compute outlasts the comm):  all of O hidden, step += D
      B <  O - D (comm outlasts the compute):  the compute, B / (1 - D/O) long, hides that
                                               much of O; the rest of O is exposed
  i.e. the overlapped window lasts max(O, B + D). Overlap hides at most the step's busy time.

    scaling ratio = compute / step = E2E MFU / local MFU

The projection (projection.py), the communication chapter (notebook 08, `one_step`) and the
check against measured runs (validate.py) all use these functions.
"""
from __future__ import annotations

import functools

from ..parallel.config import TABLE_OPTIMIZERS, MeshShape
from ..parallel.sparse import plan_tables
from ..parallel.volume import model_units, padded_numel, row_state_values, step_volume, table_shapes
from .collectives import best
from .cost_model import HardwareProfile, collective_sms as kind_sms, price_group, sm_share as kind_share

# TorchRec's sharded embeddings fuse every table's all-to-all into one per direction: the input dist
# (KJTAllToAll: every table's ids, with their counts, to the ranks that hold their rows), the output
# dist (every table's looked-up rows back) and its backward (every table's row gradients). volume.py
# counts four per step (counts, ids, rows, gradients), the way gemref's own fused exchange
# (gemref/parallel/sparse.py) issues them; TorchRec moves the same bytes in these three.
FUSED_ALL_TO_ALLS = 3


@functools.lru_cache(maxsize=256)
def _volume(cfg, shard: int, replicated: bool, batch: int, tokens: int, jagged: bool, gather_bytes: int,
            sparse: str, table_optimizer: str = "adamw") -> tuple[tuple[dict, ...], int, int]:
    """volume.py rows on a (2 if replicated else 1) x S mesh, the layer units' numel, the held table bytes.

    volume.py's bytes depend on R only through R > 1, so one call serves every R."""
    mesh = MeshShape(2 if replicated else 1, shard)
    rows = step_volume(cfg, mesh, batch=batch, tokens=tokens, jagged=jagged, param_bytes=gather_bytes,
                       reduce_bytes=4, sparse_sharding=sparse, table_optimizer=table_optimizer)
    numel = sum(padded_numel(s, shard) for unit, shapes in model_units(cfg, sparse).items() if unit != "root"
                for s in shapes)
    held = 0
    if sparse != "none" and replicated:
        held = sum(p.local_bytes(0, shard) for p in plan_tables(table_shapes(cfg), shard, sparse).values())
        if table_optimizer != "adamw":     # weights and the fp32 row state (volume.py)
            held = held * (cfg.d_model + row_state_values(table_optimizer, cfg.d_model)) / cfg.d_model
    return tuple(rows), numel, held


def step_collectives(cfg, mesh: MeshShape, batch: int, tokens: int, jagged: bool, gather_bytes: int,
                     sparse: str, fuse_all_to_alls: bool = True, table_optimizer: str = "adamw") -> list[dict]:
    """One rank's collectives (volume.py rows), the table replicas' all-reduce split out as
    dim "tables", each row with `overlappable_bytes`: the layer units' share. With
    `fuse_all_to_alls` the embedding all-to-alls are FUSED_ALL_TO_ALLS calls carrying every
    table's bytes (TorchRec); without, volume.py's four per step (gemref's own fused exchange:
    counts, ids, rows and their gradients, gemref/parallel/sparse.py).
    `table_optimizer`: "adamw" (the tables' summed gradient every step) or "rowwise_adagrad" /
    "rowwise_adam" (their weights and row state averaged; comm_rows' `table_sync_every` sets how often)."""
    rows, numel, held = _volume(cfg, mesh.shard, mesh.replicate > 1, batch, tokens, jagged, gather_bytes, sparse,
                                table_optimizer)
    if fuse_all_to_alls:
        rows = [{**r, "count": FUSED_ALL_TO_ALLS} if r["kind"] == "all_to_all" else r for r in rows]
    S = mesh.shard
    layers = {("all_gather", "shard"): 2 * numel * gather_bytes, ("reduce_scatter", "shard"): numel * 4,
              ("all_reduce", "replicate"): numel // S * 4}
    out = []
    for r in rows:
        if r["dim"] == "replicate":
            r = {**r, "group_size": mesh.replicate}
        if (r["kind"], r["dim"]) == ("all_reduce", "replicate") and held:
            out.append({**r, "dim": "tables", "count": 1, "bytes": held, "overlappable_bytes": 0})
            r = {**r, "count": r["count"] - 1, "bytes": r["bytes"] - held}
        out.append({**r, "overlappable_bytes": min(r["bytes"], layers.get((r["kind"], r["dim"]), 0))})
    return out


def check_table_sync(table_optimizer: str, table_sync_every: int) -> None:
    """What gemref's code runs: AdamW tables sum their gradients every step; only the row-wise
    optimizers' replicas sync every K steps (gemref/parallel/rowwise.py). Anything else is a ValueError."""
    if table_optimizer not in TABLE_OPTIMIZERS:
        raise ValueError(f"table_optimizer={table_optimizer!r}; valid: {', '.join(TABLE_OPTIMIZERS)}")
    if table_optimizer == "adamw" and table_sync_every != 1:
        raise ValueError(f"table_sync_every={table_sync_every} with table_optimizer='adamw': gemref sums AdamW tables' "
                         "gradients every step; a sync interval needs table_optimizer='rowwise_adagrad' or 'rowwise_adam'")


def comm_rows(rows, mesh: MeshShape, hw: HardwareProfile | None, *, kind_tiers: dict | None = None,
              table_sync_every: int = 1, algorithm: str | dict = "auto", schedule: str = "nccl") -> list[dict]:
    """Collective rows -> the same with `tier`, `algorithm`, `latency_s`, `bandwidth_s`, `seconds`
    (their sum) and `overlappable_s`.

    Each call is priced at the row's mean payload (bytes / count) with cost_model.price_group
    (NCCL's choices on `hw`'s two tiers; `algorithm` a name, "auto", or {kind: name}; `schedule`
    "flat" prices every group on its slower tier alone). `kind_tiers` {kind: LinkTier} prices those
    kinds on that one tier instead (a calibrated gloo link, collectives.best). The table replicas'
    all-reduce runs every `table_sync_every` steps: 1/K of it per step.
    """
    if table_sync_every < 1:
        raise ValueError(f"table_sync_every must be >= 1, got {table_sync_every}")
    out = []
    for r in rows:
        dim = "replicate" if r["dim"] == "tables" else r["dim"]
        alg = algorithm.get(r["kind"], "auto") if isinstance(algorithm, dict) else algorithm
        per_call = r["bytes"] / r["count"] if r["count"] else 0.0
        tier = (kind_tiers or {}).get(r["kind"])
        if tier is not None:
            cost, tier_name = best(r["kind"], per_call, r["group_size"], tier, alg), tier.name
        elif hw is None:
            raise ValueError(f"no hardware profile and no calibrated tier for {r['kind']}: give hw or kind_tiers")
        else:
            cost, tier_name = price_group(r["kind"], per_call, r["group_size"], dim, mesh, hw, alg, schedule)
        cost = cost.times(r["count"] / (table_sync_every if r["dim"] == "tables" else 1))
        share = r.get("overlappable_bytes", 0) / r["bytes"] if r["bytes"] else 0.0
        out.append({**r, "tier": tier_name, "algorithm": cost.algorithm, "latency_s": cost.latency_s,
                    "bandwidth_s": cost.bandwidth_s, "seconds": cost.seconds, "overlappable_s": cost.seconds * share})
    return out


def comm_split(rows: list[dict]) -> dict:
    """The step's communication seconds split into latency (message steps) and bandwidth (bytes)."""
    return {"comm_latency_s": sum(r["latency_s"] for r in rows),
            "comm_bandwidth_s": sum(r["bandwidth_s"] for r in rows)}


def exposed_only(rows: list[dict]) -> list[dict]:
    """The same collectives with nothing allowed to overlap compute."""
    return [{**r, "overlappable_s": 0.0} for r in rows]


def with_sm_shares(rows: list[dict], hw: HardwareProfile, transport: str = "nccl",
                   collective_sms: int | None = None, sm_share: float | None = None) -> list[dict]:
    """Priced rows with `sms` (SMs the collective holds while it runs, by kind on `transport`, or
    `collective_sms` for every kind) and `sm_share` = sms / the GPU's SM count. A given
    `sm_share` (a measured slowdown, say) is every row's share instead, with `sms` None."""
    sms = [kind_sms(r["kind"], transport, collective_sms) for r in rows]    # checks transport and k
    if sm_share is not None:
        return [{**r, "sms": None, "sm_share": check_share(sm_share)} for r in rows]
    return [{**r, "sms": k, "sm_share": kind_share(r["kind"], hw, transport, collective_sms)} for r, k in zip(rows, sms)]


def check_share(value, what: str = "sm_share") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{what} must be a number in [0, 1], got {value!r}")
    return float(value)


def predict_step(compute_s: float, imbalance_factor: float, rows: list[dict], sm_share: float | None = None) -> dict:
    """step = compute x imbalance + exposed comm + SM slowdown (module doc), in seconds.

    Each row's `sm_share` (0 when absent) is the share of the SMs it holds; `sm_share` given
    here applies to every row instead."""
    if compute_s < 0 or imbalance_factor < 1 - 1e-12:
        raise ValueError(f"need compute_s >= 0 and imbalance >= 1, got {compute_s}, {imbalance_factor}")
    if sm_share is not None:
        check_share(sm_share)
    shares = [check_share(sm_share if sm_share is not None else r.get("sm_share", 0.0), f"{r['kind']} sm_share")
              for r in rows]
    busy = compute_s * imbalance_factor
    comm = sum(r["seconds"] for r in rows)
    want = sum(r["overlappable_s"] for r in rows)
    lost = sum(r["overlappable_s"] * s for r, s in zip(rows, shares))   # compute lost if all of `want` is hidden
    if busy > 0 and busy >= want - lost:         # the compute outlasts the overlapped comm
        hidden, slowdown, window = want, lost, busy + lost
    else:                                        # the comm outlasts the compute, slowed to 1 - lost/want under it
        hidden = busy / (1 - lost / want) if busy > 0 else 0.0
        slowdown, window = hidden - busy, want
    scale = hidden / want if want else 0.0
    exposed = {}
    for r in rows:
        name = f"{r['kind']} ({r['dim']})"
        exposed[name] = exposed.get(name, 0.0) + r["seconds"] - r["overlappable_s"] * scale
    step = window + (comm - want)               # = busy + exposed + slowdown
    return {"compute_s": compute_s, "bubble_s": busy - compute_s, "comm_s": comm, "exposed_s": comm - hidden,
            "overlapped_s": hidden, "sm_slowdown_s": slowdown, "exposed_by_kind": exposed, "step_s": step,
            "scaling_ratio": compute_s / step if step > 0 else 1.0}


def one_step(cfg, mesh: MeshShape, hw: HardwareProfile, *, batch: int, tokens: int, model_flops: float,
             local_mfu: float, jagged: bool = True, sparse_sharding: str = "row", gather_bytes: int = 2,
             imbalance: float = 1.0, transport: str = "nccl", collective_sms: int | None = None,
             sm_share: float | None = None, table_sync_every: int = 1, fuse_all_to_alls: bool = True,
             schedule: str = "nccl", table_optimizer: str = "adamw") -> dict:
    """One rank's step on `mesh` of `hw` GPUs: compute = model_flops / (bf16 peak x local_mfu),
    its collectives priced and overlapped as in the module doc, each holding the SMs of its
    kind on `transport` (or `collective_sms`; `sm_share` overrides both). `batch`/`tokens`:
    samples and history events per rank. `fuse_all_to_alls` and `schedule`: step_collectives,
    comm_rows. Adds the collectives, their `comm_latency_s` and `comm_bandwidth_s`, and
    `comm_share_no_overlap`: the comm share of the step when nothing overlaps."""
    from ..mfu.meter import seconds_at
    from ..mfu.peak import gpu_peak

    if not 0 < local_mfu <= 1:
        raise ValueError(f"local_mfu must be in (0, 1], got {local_mfu}")
    peak = gpu_peak(hw.gpu, "bf16")
    if peak.flops is None:
        raise ValueError(f"hardware profile {hw.name!r}: no bf16 peak for GPU {hw.gpu!r}")
    check_table_sync(table_optimizer, table_sync_every)
    rows = comm_rows(step_collectives(cfg, mesh, batch, tokens, jagged, gather_bytes, sparse_sharding,
                                      fuse_all_to_alls, table_optimizer), mesh, hw, table_sync_every=table_sync_every,
                     schedule=schedule)
    rows = with_sm_shares(rows, hw, transport, collective_sms, sm_share)
    compute_s = seconds_at(model_flops, local_mfu, peak.flops)
    step = predict_step(compute_s, imbalance, rows)
    serial = predict_step(compute_s, imbalance, exposed_only(rows))
    return {**step, **comm_split(rows), "comm_share_no_overlap": serial["exposed_s"] / serial["step_s"],
            "peak_source": peak.source, "collectives": rows}
