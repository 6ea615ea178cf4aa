"""The best rung of a waterfall record, one rank's step profiled op by op: where its time goes.

    python scripts/best_rung_profile.py artifacts/waterfall/waterfall.json --json out.json

reads the record `gemref waterfall --json` (or --out) wrote, takes its rung with the highest
E2E MFU (gemref.walkthrough.best_rung) and profiles one rank's step of that rung's recorded
config in this process (profile_rung: its model, switches and per-rank batch; balancing and
sharding left out), then prints the op classes (ms per step and share of the profiled step), the
ops classed "other" one by one, and the GEMM limits. The record keeps every op. Exit 2 on a
missing or malformed record.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("waterfall", type=Path, help="a waterfall record (waterfall.json)")
    p.add_argument("--json", type=Path, required=True, help="write the profile record here")
    p.add_argument("--other-rows", type=int, default=20, help="rows of the printed 'other' table")
    a = p.parse_args(argv)
    from gemref.train.presets import get_preset
    from gemref.train.record import record_version

    try:
        record = json.loads(a.waterfall.read_text())
        rows, ranks, preset_name = record["rungs"], int(record["ranks"]), record["preset"]
        version = record_version(record)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {a.waterfall}: not a readable waterfall record ({e})", file=sys.stderr)
        return 2
    import torch

    from gemref.env import cpu_info
    from gemref.report import format_table
    from gemref.walkthrough.best_rung import best_rung, profile_rung

    torch.set_num_threads(1)                  # as one rank of the waterfall ran
    top, why = best_rung(rows)
    prof = profile_rung(get_preset(preset_name), top, ranks=ranks, version=version)
    cpu = cpu_info()
    print(f"{top['rung']} ({why}), one rank's step at batch {prof['batch_size']}; {cpu.model_name} "
          f"(family {cpu.family} model {cpu.model})")
    print(format_table(prof["classes"], title="time per op class (self CPU time, profiled steps)"))
    print(format_table(prof["other_ops"][:a.other_rows], title="what 'other' is, op by op"))
    print(format_table(prof["limits"], title="the step and its GEMM limits"))
    a.json.write_text(json.dumps({"waterfall": str(a.waterfall), "why": why,
                                  "cpu": f"{cpu.model_name} (family {cpu.family} model {cpu.model})", **prof},
                                 indent=1, default=str) + "\n")
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
