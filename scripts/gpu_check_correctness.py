"""GPU check, section "correctness": the Triton GDPA kernel against the float64 reference.

Forward and backward (out, dq, dk, dv) on a skewed jagged batch (lengths 300, 1, 0, 77, 129,
17: several tiles, partial tiles, an empty and a one-row sequence), H = 2, D = 128, at fixed
tiles (no autotuning, except the "autotune" variant): bf16 and fp16, silu and softmax,
causal and not, a sliding window, cross attention (4 queries per sample); then every variant
of gpu_check_common.VARIANTS on causal bf16 silu and softmax (--dry-run: softmax only with
every flag at once); then determinism: the same
inputs twice: out, dk, dv (and dq, except with the atomic backward) must be bitwise equal, else
the record fails; the atomic dQ's max difference is recorded.
Error = max |triton - reference| / max(1, max |reference|) per tensor, against a tolerance
of 3e-2 (bf16) or 1e-2 (fp16). Items are split over shards (--shard i/n), heaviest first.
"""
from __future__ import annotations

import time

from gpu_check_common import VARIANTS, Result, device, error_text, parse_args

TOLERANCE = {"bfloat16": 3e-2, "float16": 1e-2}


def items(dry_run: bool) -> list[dict]:
    lens = [20, 1, 0, 9, 17, 5] if dry_run else [300, 1, 0, 77, 129, 17]
    case = {"q_lens": lens, "kv_lens": lens, "cross": False, "causal": True, "window": None,
            "activation": "silu", "heads": 1 if dry_run else 2, "qk_scale": None, "out_scale": 1.0, "seed": 0}
    out = []

    def add(name, variant="base", dtype="bfloat16", repeat=False, weight=3, **changes):
        out.append({"name": name, "variant": variant, "dtype": dtype, "repeat": repeat, "weight": weight,
                    "case": {**case, **changes}})

    for act in ("silu", "softmax"):
        for dtype in ("bfloat16", "float16"):
            add(f"{act} causal {dtype}", dtype=dtype, activation=act)
        add(f"{act} full", activation=act, causal=False)
        add(f"{act} causal window", activation=act, window=9 if dry_run else 100)
        add(f"{act} cross", activation=act, causal=False, cross=True, q_lens=[4] * len(lens))
        for variant in VARIANTS:
            if variant == "base" or (act == "softmax" and (variant == "silu_tanh" or (dry_run and variant != "all_flags"))):
                continue   # (the dry run checks the plumbing: softmax only with all flags)
            add(f"{act} causal [{variant}]", variant, activation=act, weight=10 if variant == "autotune" else 3)
    add("silu full [autotune]", "autotune", causal=False, weight=10)   # the model's cross attention
    add("determinism silu [base]", repeat=True)
    add("determinism softmax [atomic_bwd]", "atomic_bwd", repeat=True, activation="softmax")
    return out


def shard(all_items: list[dict], index: int, count: int) -> list[dict]:
    """Heaviest first, each to the least loaded shard (the same split in every shard)."""
    loads, mine = [0] * count, []
    for item in sorted(all_items, key=lambda it: -it["weight"]):
        target = loads.index(min(loads))
        loads[target] += item["weight"]
        if target == index:
            mine.append(item)
    return mine


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    import torch
    from gemref.attention.testing import make_inputs, reference_results, run

    from gemref.attention.triton.variant import use_variant

    dev = device(args.dry_run)
    head_dim = 16 if args.dry_run else 128
    result = Result(args.result, cases=[], determinism=[], passed=0, failed=0)
    references: dict[str, list] = {}
    for item in shard(items(args.dry_run), args.shard_index, args.shard_count):
        case, dtype = item["case"], getattr(torch, item["dtype"])
        record = {k: item[k] for k in ("name", "variant", "dtype")} | {"spec": VARIANTS[item["variant"]]}
        t0 = time.perf_counter()
        try:
            key = repr(case)
            if key not in references:
                references[key] = reference_results(case, head_dim)
            expected = references[key]
            with use_variant(VARIANTS[item["variant"]]):
                runs = [run("triton", case, *make_inputs(case, head_dim, dtype, str(dev)))
                        for _ in range(2 if item["repeat"] else 1)]
            if dev.type == "cuda":
                torch.cuda.synchronize()
            errors = {}
            for name, got, ref in zip(("out", "dq", "dk", "dv"), runs[0], expected):
                got = got.to("cpu", torch.float64)
                finite = bool(torch.isfinite(got).all())
                err = float((got - ref).abs().max()) if got.numel() else 0.0
                errors[name] = err / max(1.0, float(ref.abs().max()) if ref.numel() else 0.0) if finite else float("inf")
            tolerance = TOLERANCE[item["dtype"]]
            record.update(errors=errors, tolerance=tolerance, passed=max(errors.values()) <= tolerance)
            if item["repeat"]:
                diffs = {n: float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
                         for n, a, b in zip(("out", "dq", "dk", "dv"), *runs)}
                equal = {n: bool(torch.equal(a, b)) for n, a, b in zip(("out", "dq", "dk", "dv"), *runs)}
                record["repeat"] = {"bitwise_equal": equal, "max_abs_diff": diffs}
                # Deterministic: everything but the atomic backward's dQ (its summation order varies).
                must_equal = [n for n in equal if not (n == "dq" and "bwd=atomic" in VARIANTS[item["variant"]])]
                record["passed"] = record["passed"] and all(equal[n] for n in must_equal)
        except Exception as e:   # noqa: BLE001  (one failing case must not hide the others)
            record.update(passed=False, error=error_text(e))
        record["seconds"] = round(time.perf_counter() - t0, 2)
        result.data["passed" if record["passed"] else "failed"] += 1
        result.append("determinism" if item["repeat"] else "cases", record)
        print(f"{record['name']}: {'ok' if record['passed'] else 'FAILED'} {record.get('error', '')}", flush=True)


if __name__ == "__main__":
    main()
