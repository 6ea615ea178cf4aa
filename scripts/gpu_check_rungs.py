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

from gpu_check_common import Result, device, error_text, parse_args

RUNGS = 3
MIN_BATCH = 32


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    import torch

    from gemref.config import get_preset, override
    from gemref.data.shards import ensure_dataset
    from gemref.train import dataset_dir
    from gemref.waterfall import LADDER, Rung, run_waterfall

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

    for i in range(RUNGS):
        def configure(train, ctx, upto=i):   # rungs 0..i applied in turn, as the waterfall does
            for rung in LADDER[:upto + 1]:
                nxt = rung.configure(train, ctx)
                train = train if isinstance(nxt, str) else nxt
            return train

        batch, tried, record = preset.train.batch_size, [], {"rung": LADDER[i].title}
        t0 = time.perf_counter()
        while True:
            tried.append(batch)
            attempt = dataclasses.replace(preset, train=override(preset.train, batch_size=batch))
            try:
                row = run_waterfall(attempt, device=dev.type, ranks=1, repeats=repeats, steps=steps, warmup=warmup,
                                    ladder=[Rung(LADDER[i].key, LADDER[i].title, configure)])[0]
                record.update(row)
                break
            except torch.OutOfMemoryError:
                error = f"out of memory at batch {batch}"
            except Exception as e:   # noqa: BLE001  (recorded; the next rung still runs)
                record.update(status="failed", error=error_text(e))
                break
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            if batch // 2 < MIN_BATCH:
                record.update(status="failed", error=error)
                break
            batch //= 2
        record.update(batches_tried=tried, seconds=round(time.perf_counter() - t0, 1))
        result.append("rungs", record)
        print(f"{record['rung']}: {record.get('status')} batch {tried[-1]} MFU {record.get('mfu')}", flush=True)


if __name__ == "__main__":
    main()
