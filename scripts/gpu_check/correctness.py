"""GPU check, section "correctness": the Triton GDPA kernel against the float64 reference.

Forward and backward (out, dq, dk, dv) of gemref.attention.testing.correctness_items: a
skewed jagged batch (lengths 300, 1, 0, 77, 129, 17: several tiles, partial tiles, an empty
and a one-row sequence), H = 2, D = 128, at fixed tiles (no autotuning, except the "autotune"
variant): bf16 and fp16, silu and softmax, causal and not, a sliding window, cross attention
(4 queries per sample); D = 16 and 64 on causal bf16 silu and softmax; every variant of
VARIANTS on causal bf16 silu and softmax (--dry-run: D = 16, and 32, H = 1, softmax only
with DRY_VARIANTS); then determinism: the same inputs
twice: out, dk, dv (and dq, except with the atomic backward) must be bitwise equal, else the
record fails; the atomic dQ's max difference is recorded.
Error = max |triton - reference| / max(1, max |reference|) per tensor, against a tolerance
of 3e-2 (bf16) or 1e-2 (fp16). Items are split over shards (--shard i/n, shard_items:
heaviest first).
"""
from __future__ import annotations

import time

from .common import Result, device, error_text, parse_args

TOLERANCE = {"bfloat16": 3e-2, "float16": 1e-2}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    import torch

    from gemref.attention.testing import (VARIANTS, correctness_items, make_inputs, reference_results, run,
                                          shard_items)
    from gemref.attention.triton.variant import use_variant

    dev = device(args.dry_run)
    section_head_dim = 16 if args.dry_run else 128
    result = Result(args.result, cases=[], determinism=[], passed=0, failed=0)
    references: dict[str, list] = {}
    for item in shard_items(correctness_items(args.dry_run), args.shard_index, args.shard_count):
        case, dtype = item["case"], getattr(torch, item["dtype"])
        head_dim = item["head_dim"] or section_head_dim
        record = {k: item[k] for k in ("name", "variant", "dtype")} | {"spec": VARIANTS[item["variant"]],
                                                                        "head_dim": head_dim}
        t0 = time.perf_counter()
        try:
            key = repr((case, head_dim))
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
