"""GPU check, section "rungs": MFU of waterfall rungs 0-2 in bf16, one rung alive at a time,
then rung 2 again with row-wise float8 GEMMs, and rung 3 (every region compiled), on rung 2's batch.

The GPU preset (`gpu_preset`): the base preset's model with every embedding table cut to
TABLE_ROWS rows. Tables are looked up, never multiplied, so model FLOPs are unchanged, while
the training state (fp32 weights and gradients and AdamW's two moments, 16 bytes per parameter:
gemref.parallel.memory.projected_rank_bytes) falls from 28.3 GB to 9.0 GB. It trains on ONE
small generated shard (4096 training rows, 512 eval rows; seconds to generate).

Each rung runs alone (gemref.waterfall.run_waterfall on a one-rung ladder whose rung applies
the switches of every rung up to it), so only its model, optimizer and activations are alive,
and its row is written the moment it is measured (the driver copies it into the summary).
Its batch is the largest power of two, up to the preset's, whose estimated activations
(`activation_bytes_per_sample`) fit in MEMORY_SHARE of the free memory beside the training
state: rungs 0 and 1 materialise (batch x heads x max_len^2) attention scores, 0.84 and 0.62 GB
per sample by the estimate at the base shape, so on an 80 GB card they run batch 64 and rung 2
the preset's 256. If a rung runs out of memory anyway, that rung alone is retried at half the
batch (gemref.measure.run.halving_batch), down to MIN_BATCH. Each row records the
estimate, the batch that ran and the batches tried; `vs_previous` is left out (one rung alive:
no paired windows). The float8 row (rung 2's switches and batch, precision float8_rowwise)
runs natively where gemref.precision.support says so, else shows "n/a here, because ...". It
converts every Linear of at least 64 (precision_min_dim=64): by torchao's H100 rule, which a
native float8 run follows without a min_dim (gemref/precision/apply.py gpu_pays_filter), none
of the base model's Linears (d_model 512, FFN 2048) would pay, and the row would not exercise
float8 GEMMs at all;
the dry run runs it emulated (numerics only) so its path is exercised. The compile row is
rung 2 with torch.compile on every region (the waterfall's rung 3 first measures which regions
win; the check skips that search for time) and runs last: Inductor's build is the costliest.
The summary's headline names the rung with the best MFU.

--dry-run: the tiny preset on CPU (fp32), 512 rows, every row at tiny size.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import time

from .common import Result, device, error_text, parse_args, tf32_policy

RUNGS = 3                # rungs 0 .. RUNGS-1 of the ladder
MIN_BATCH = 8
TABLE_ROWS = 100_000     # rows per embedding table in the GPU preset
MEMORY_SHARE = 0.8       # of the free memory: the rest for the allocator's fragmentation and workspaces
TOKEN_BYTES = 34         # bytes a transformer layer keeps per token per d_model unit, 16-bit, no recompute
SCORE_BYTES = 5          # bytes kept per materialised score: the scores, the weights, the mask


def gpu_preset(preset, table_rows: int = TABLE_ROWS):
    """`preset` with every embedding table (items, sparse features) cut to `table_rows` rows."""
    model = dataclasses.replace(preset.model, item_vocab=min(preset.model.item_vocab, table_rows),
                                sparse_vocab=tuple(min(v, table_rows) for v in preset.model.sparse_vocab))
    return dataclasses.replace(preset, model=model)


def mean_tokens(data, max_len: int) -> float:
    """Expected history length per sample (events): an upper bound for the skewed profile (the
    untruncated log-normal's mean, capped at max_len)."""
    if data.length_profile == "fixed":
        return float(min(data.median_len, max_len))
    if data.length_profile == "uniform":
        return (max_len + 1) / 2
    return min(float(max_len), data.median_len * math.exp(data.len_sigma ** 2 / 2))


def activation_bytes_per_sample(model, tokens: float, scores_len: int | None, element_bytes: int) -> float:
    """Activation bytes one sample keeps for the backward pass, estimated: per layer TOKEN_BYTES
    x d_model per token (Korthikanti et al. 2022's count for a 16-bit transformer layer) plus,
    with materialised attention, SCORE_BYTES per score (heads x scores_len^2); scaled by
    element_bytes / 2; over n_layers + 1 layers (the transients of the layer whose backward runs)."""
    per_layer = TOKEN_BYTES * model.d_model * tokens
    if scores_len:
        per_layer += SCORE_BYTES * model.n_heads * scores_len ** 2
    return (model.n_layers + 1) * per_layer * element_bytes / 2


def fitting_batch(free_bytes: float, state_bytes: float, per_sample: float, largest: int,
                  smallest: int = MIN_BATCH) -> int | None:
    """The largest power of two <= `largest` (or `largest` itself) whose activations fit beside
    the training state in MEMORY_SHARE of `free_bytes`; None below `smallest`."""
    room = MEMORY_SHARE * free_bytes - state_bytes
    if room < smallest * per_sample:
        return None
    fits = int(room // per_sample)
    return largest if fits >= largest else 2 ** int(math.log2(fits))


def rung_estimate(preset, train, element_bytes: int) -> float:
    """activation_bytes_per_sample for a rung's TrainConfig: padded (rung 0) keeps max_len tokens
    and scores; jagged with the reference kernel (rung 1) pads only the scores (to the batch's
    longest, near max_len at these batches); a fused kernel keeps no scores."""
    att, max_len = train.attention, preset.model.max_len
    tokens = mean_tokens(preset.data, max_len) if att.jagged else max_len
    scores = max_len if att.kernel == "reference" else None
    return activation_bytes_per_sample(preset.model, tokens, scores, element_bytes)


def measured_row(spec, batch: int, run_at) -> dict:
    """run_at(batch) -> the rung's waterfall row; out of memory: this rung alone again at half
    the batch (gemref.measure.run.halving_batch), down to MIN_BATCH; any other error becomes a
    failed row. The row gains batches_tried and seconds, and loses the ratios to other rungs."""
    import torch

    from gemref.measure.run import halving_batch

    t0, tried = time.perf_counter(), [batch]
    try:
        row, tried = halving_batch(run_at, batch, smallest=MIN_BATCH, log=lambda s: print(s, flush=True))
    except torch.OutOfMemoryError:
        tried = [b for b in (batch >> i for i in range(batch.bit_length())) if b >= MIN_BATCH]
        row = {"rung": spec.title, "key": spec.key, "status": "failed", "error": f"out of memory down to batch {tried[-1]}"}
    except Exception as e:   # noqa: BLE001  (recorded; the next rung still runs)
        row = {"rung": spec.title, "key": spec.key, "status": "failed", "error": error_text(e)}
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    for key in ("vs_previous", "vs_baseline", "config"):
        row.pop(key, None)
    return row | {"batches_tried": tried, "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    from gemref.parallel.config import MeshShape
    from gemref.train.presets import get_preset
    from gemref.train.override import override
    from gemref.data.shards import dataset_dir, ensure_dataset
    from gemref.parallel.memory import projected_rank_bytes
    from gemref.precision.support import precision_support
    from gemref.waterfall import LADDER, Context, Rung, run_waterfall
    from gemref.waterfall.rungs import plan
    from gemref.waterfall.runner import free_bytes

    dev = device(args.dry_run)
    preset = get_preset("tiny") if args.dry_run else gpu_preset(get_preset("base"))
    rows, n_eval = (512, 128) if args.dry_run else (4096, 512)
    preset = dataclasses.replace(preset, data=override(preset.data, n_train=rows, n_eval=n_eval, shard_rows=rows),
                                 train=override(preset.train, precision="auto" if args.dry_run else "bf16"))
    steps, warmup, windows = (1, 1, 3) if args.dry_run else (2, 2, 3)
    element_bytes = 4 if args.dry_run else 2
    state = projected_rank_bytes(preset.model, MeshShape(1, 1))["total"]
    result = Result(args.result, preset=preset.name, device=str(dev), n_train=rows, n_eval=n_eval,
                    table_rows=None if args.dry_run else TABLE_ROWS, state_bytes=state,
                    steps_per_window=steps, warmup=warmup, windows=windows, tf32=tf32_policy(), rungs=[])
    t0 = time.perf_counter()
    ensure_dataset(preset.model, preset.data, dataset_dir(preset.name, preset.model, preset.data))
    result.data["data_seconds"] = round(time.perf_counter() - t0, 1)
    result.save()

    ctx = Context(preset, dev, 1)
    start = override(preset.train, eval_every=0, eval_batches=1)
    configs = [c for _, c in plan(list(LADDER[:RUNGS]), start, ctx)]    # rungs 0-2 only set switches
    f8 = precision_support("float8_rowwise", dev)
    low = (override(configs[-1], precision="float8_rowwise", precision_kernel="native", precision_min_dim=64)
           if f8.native else
           override(configs[-1], precision="float8_rowwise", precision_kernel="emulated", precision_min_dim=64)
           if args.dry_run and f8.runs
           else f"n/a here, because {f8.reason}")
    f8_spec = dataclasses.replace(LADDER[RUNGS - 1].spec, key="fused_attention_float8_rowwise",
                                  title=f"{LADDER[RUNGS - 1].title} + float8 row-wise (same batch)")
    compiled_spec = dataclasses.replace(LADDER[RUNGS].spec, key=f"{LADDER[RUNGS].key}_every_region",
                                        title=f"{LADDER[RUNGS].title} (every region)")
    compiled = override(configs[-1], compile=True)
    # last: the costliest to build (Inductor), so a section out of time loses only its own row
    todo = [(LADDER[i].spec, c) for i, c in enumerate(configs)] + [(f8_spec, low), (compiled_spec, compiled)]
    same_batch_as = dict.fromkeys((f8_spec.key, compiled_spec.key), LADDER[RUNGS - 1].key)   # one batch
    batch_of_rung = {}
    for spec, train in todo:
        if isinstance(train, str):
            result.append("rungs", {"rung": spec.title, "key": spec.key, "status": train})
            continue
        per_sample = rung_estimate(preset, train, element_bytes)
        free = free_bytes(dev)
        batch = batch_of_rung.get(same_batch_as.get(spec.key)) or \
            fitting_batch(free, state, per_sample, preset.train.batch_size)
        estimate = {"activation_bytes_per_sample": round(per_sample), "free_bytes": round(free),
                    "state_bytes": state}
        if batch is None:
            result.append("rungs", {"rung": spec.title, "key": spec.key, "status": "failed", **estimate,
                                    "error": f"even batch {MIN_BATCH} does not fit the estimate"})
            continue

        def run_at(batch, spec=spec, train=train):
            attempt = override(train, batch_size=batch)
            record = run_waterfall(dataclasses.replace(preset, train=attempt), device=dev.type, ranks=1,
                                   windows=windows, steps_per_window=steps, warmup=warmup,
                                   ladder=[Rung(spec, lambda t, c: attempt)], log=lambda s: None)
            return record["rungs"][0]

        row = measured_row(spec, batch, run_at) | estimate
        if row.get("status") == "ran":
            batch_of_rung[spec.key] = row["batch_size"]
        result.append("rungs", row)
        print(f"{row['rung']}: batch {row.get('batch_size')} MFU {row.get('mfu')} {row.get('error', '')}", flush=True)


if __name__ == "__main__":
    main()
