"""SM contention at scale: step time, MFU and QPS with NCCL's SMs vs an SM-free transport (projected).

A collective that runs while compute runs holds k of the GPU's SMs, and the compute under
it runs on the rest: about k / SM count slower for as long as they overlap
(gemref/simulate/step_model.py). NCCL's kernels hold 24 SMs per collective (Meta's figure for
GEM's all-gather); NCCLX's host-driven transport holds 1 for the collectives that only move
bytes (cost_model.TRANSPORTS: reductions keep NCCL's SMs, an assumption). For every GPU count
and ladder rung this projects (gemref/simulate/projection.py, weak scaling) the step under

    nccl          every collective at --nccl-sms (default 24)
    ncclx_smfree  NCCLX's SM-free transport (all-gather, all-to-all, broadcast at 1 SM)
    all_smfree    every collective at --smfree-sms (default 1): the bound if reductions were too

and prints step seconds, E2E MFU, the QPS gain over NCCL (same samples per step: step ratio
- 1), the compute seconds overlapped by collectives and `contention`, the share of NCCL's
step lost to SM contention, set against GEM's reported ~5% QPS (contention up to 15%).
It is a projection (collectives priced as NCCL runs them, gemref/simulate/collectives.py; assumed
or given local MFU), not a timing: the figures are deterministic for given flags.
"""
from __future__ import annotations

import argparse

from ..options import output_file
from ..train.presets import PRESETS, get_preset
from ..errors import UsageError
from ..report import format_table
from ..runtime.files import write_json
from ..simulate.cost_model import HARDWARE, NCCL_COLLECTIVE_SMS, sm_count
from ..simulate.projection import (GEM_SM_CONTENTION_MAX, GEM_SMFREE_QPS_GAIN, GPU_COUNTS, LADDER, Options,
                                   hardware_of)
from ..simulate.summary import (compare_transports, contention_findings, parse_mfu_assumption, rung_pivot,
                                transport_variants)

COLUMNS = ("gpus", "rung", "mesh", "compute_s", "overlapped_s", "step_s_nccl", "step_s_ncclx_smfree",
           "step_s_all_smfree", "mfu_nccl", "mfu_ncclx_smfree", "qps_gain_ncclx_smfree", "qps_gain_all_smfree",
           "contention")


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="large", choices=list(PRESETS), help="the GEM-like model projected")
    p.add_argument("--hardware", default="h100_ib_ndr", choices=list(HARDWARE), help="cluster profile (cost_model.py)")
    p.add_argument("--gpus", type=int, nargs="+", help="GPU counts (default 8 16 ... 4096)")
    p.add_argument("--rungs", nargs="+", metavar="RUNG", help="ladder rungs to show (default: all): "
                                                             + ", ".join(r.key for r in LADDER))
    p.add_argument("--batch-per-gpu", type=int, help="samples per GPU and step (default: the preset's batch size)")
    p.add_argument("--batches", type=int, default=1, help="global batches drawn per GPU count for the imbalance")
    p.add_argument("--nccl-sms", type=int, help="SMs an NCCL collective holds (default 24)")
    p.add_argument("--smfree-sms", type=int, default=1, help="SMs of every collective in the all_smfree bound")
    p.add_argument("--mfu-assumption", nargs="+", metavar="[RUNG=]MFU",
                   help="local MFU in (0, 1]: one value for every rung, or RUNG=VALUE (default: assumed per rung)")
    p.add_argument("--table-sync-every", type=int, default=1, help="all-reduce the table replicas every K steps")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def select_rungs(keys: list[str] | None) -> list:
    """The LADDER rungs named by `keys` (all when None), in ladder order; UsageError on an unknown key."""
    if not keys:
        return list(LADDER)
    valid = [r.key for r in LADDER]
    unknown = [k for k in keys if k not in valid]
    if unknown:
        raise UsageError(f"--rungs {' '.join(unknown)}: unknown rung; valid: {', '.join(valid)}")
    return [r for r in LADDER if r.key in keys]


def run(args: argparse.Namespace) -> int:
    options = Options(hardware=args.hardware, batch_per_gpu=args.batch_per_gpu, batches=args.batches,
                      table_sync_every=args.table_sync_every)
    hw = hardware_of(options)
    n = sm_count(hw)
    for flag, k in (("--nccl-sms", args.nccl_sms), ("--smfree-sms", args.smfree_sms)):
        if k is not None and not 0 <= k <= n:
            raise UsageError(f"{flag} {k}: SMs per collective must be in 0..{n} (the SMs of an {hw.gpu})")
    preset = get_preset(args.preset)
    rows = compare_transports(preset, args.gpus or list(GPU_COUNTS), options,
                              transport_variants(args.nccl_sms, args.smfree_sms),
                              mfu=parse_mfu_assumption(args.mfu_assumption), ladder=select_rungs(args.rungs))
    k = NCCL_COLLECTIVE_SMS if args.nccl_sms is None else args.nccl_sms
    print(format_table(rows, COLUMNS, title=f"SM contention, {preset.name} preset on {hw.name} ({n} SMs per GPU): "
                                            f"NCCL at {k} SMs per collective vs SM-free; seconds per step and rank, "
                                            "projected"))
    print(format_table(rung_pivot(rows, "qps_gain_ncclx_smfree"), title="QPS gain of NCCLX's SM-free transport over NCCL, per GPU count "
                                               f"and rung (GEM reported ~{GEM_SMFREE_QPS_GAIN:.0%})"))
    lines = contention_findings(rows, options, args.nccl_sms, args.smfree_sms)
    for line in lines:
        print(line)
    if args.json:
        write_json(args.json, {"bench": "sm_contention", "preset": preset.name, "hardware": hw.name, "sm_count": n,
                               "nccl_sms": k, "smfree_sms": args.smfree_sms, "gem_qps_gain": GEM_SMFREE_QPS_GAIN,
                               "gem_contention_max": GEM_SM_CONTENTION_MAX, "rows": rows, "findings": lines})
        print(f"wrote {args.json}")
    return 0
