"""GPU check, section "rungs": MFU of the base preset's waterfall rungs 0-2 in bf16.

The base preset's model and batch on ONE small generated shard (4096 training rows, 512
eval rows; a few seconds to generate instead of the full dataset's minutes), each rung run
through gemref.waterfall.run_waterfall (warm-up steps, then 3 timed windows; median window):
rung 0 padded with materialised attention, rung 1 jagged, rung 2 the fused kernel
(kernel=auto: the Triton GDPA kernel for silu, with the library's default variant). A rung
that runs out of GPU memory is retried at half the batch (down to 32), and the batch that
ran is recorded; any other error is recorded and the next rung still runs. Every finished
rung is written at once. --dry-run: the tiny preset on CPU (fp32), 512 rows.
"""
from __future__ import annotations

import dataclasses
import gc
import time

from .common import Result, device, error_text, parse_args

RUNGS = 3
MIN_BATCH = 32


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    import torch

    from gemref.config import get_preset, override
    from gemref.data.shards import dataset_dir, ensure_dataset
    from gemref.waterfall import LADDER, run_waterfall

    dev = device(args.dry_run)
    preset = get_preset("tiny" if args.dry_run else "base")
    rows, n_eval = (512, 128) if args.dry_run else (4096, 512)
    preset = dataclasses.replace(preset, data=override(preset.data, n_train=rows, n_eval=n_eval, shard_rows=rows),
                                 train=override(preset.train, precision="auto" if args.dry_run else "bf16"))
    steps, warmup, repeats = (1, 1, 3) if args.dry_run else (2, 2, 3)
    result = Result(args.result, preset=preset.name, device=str(dev), n_train=rows, n_eval=n_eval,
                    steps_per_window=steps, warmup=warmup, repeats=repeats, rungs=[])
    t0 = time.perf_counter()
    ensure_dataset(preset.model, preset.data, dataset_dir(preset))
    result.data["data_seconds"] = round(time.perf_counter() - t0, 1)
    result.save()

    # Rungs 0..RUNGS-1 in one interleaved waterfall (window k of every rung before window k+1);
    # out of memory: the whole ladder again at half the batch, down to MIN_BATCH.
    batch, tried = preset.train.batch_size, []
    t0 = time.perf_counter()
    while True:
        tried.append(batch)
        attempt = dataclasses.replace(preset, train=override(preset.train, batch_size=batch))
        try:
            record = run_waterfall(attempt, device=dev.type, ranks=1, windows=repeats, steps_per_window=steps,
                                   warmup=warmup, ladder=list(LADDER[:RUNGS]))
            for row in record["rungs"]:
                result.append("rungs", row)
                print(f"{row.get('rung')}: batch {row.get('batch_size')} MFU {row.get('mfu')} "
                      f"(local {row.get('local_mfu')})", flush=True)
            break
        except torch.OutOfMemoryError:
            error = f"out of memory at batch {batch}"
        except Exception as e:   # noqa: BLE001  (recorded in the summary)
            result.append("rungs", {"status": "failed", "error": error_text(e)})
            break
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        if batch // 2 < MIN_BATCH:
            result.append("rungs", {"status": "failed", "error": error})
            break
        batch //= 2
    result.data.update(batches_tried=tried, seconds=round(time.perf_counter() - t0, 1))
    result.save()


if __name__ == "__main__":
    main()
