"""`gemref flops`: the per-component FLOP table of one training step, and its verification.

Verification runs one real training step (forward + backward) of the configured path under
torch's FlopCounterMode and compares the count with the analytic *executed* FLOPs of that
path (gemref/mfu/flops.py). They must agree within `TOLERANCE`; the report also states the
waste (executed - model FLOPs), i.e. what padding and materialised attention cost.

Model FLOPs (the MFU numerator) use the exact convention: causal attention counts the
L(L+1)/2 allowed pairs. The table shows the PaLM/torchtitan count (causal as the full L^2)
beside it ("model_train_palm"), so an MFU can be compared with theirs.
"""
from __future__ import annotations

from .flops import COMPONENTS, count_with_flop_counter, executed_flops, model_flops

TOLERANCE = 0.02


def flops_report(s, batch, *, verify: bool = False) -> dict:
    """The FLOP table of one training step of a built run `s` (gemref.train.setup) on `batch`;
    with `verify`, that step counted by FlopCounterMode beside the analytic executed FLOPs."""
    cfg, train = s.preset.model, s.train
    model = model_flops(cfg, batch.lengths)
    palm = model_flops(cfg, batch.lengths, convention="palm")
    executed = executed_flops(cfg, batch.lengths, jagged=train.attention.jagged, kernel=s.kernel, device=s.device)
    rows = [{"component": c, "model_fwd": model.forward[c],
             "model_train": model.forward[c] + model.backward[c],
             "model_train_palm": palm.forward[c] + palm.backward[c],
             "executed_train": executed.forward[c] + executed.backward[c]} for c in COMPONENTS]
    rows.append({"component": "total", "model_fwd": model.total_forward, "model_train": model.total,
                 "model_train_palm": palm.total, "executed_train": executed.total})
    report = {"preset": s.preset.name, "batch_size": batch.batch_size, "tokens": batch.num_tokens,
              "jagged": train.attention.jagged, "kernel": s.kernel, "components": rows,
              "model_flops": model.total, "model_flops_palm": palm.total, "executed_flops": executed.total,
              "waste_flops": executed.total - model.total,
              "summary": [f"model FLOPs/step {model.total:.4e} (train = 3 x forward, real lengths); "
                          f"executed {executed.total:.4e}; waste {executed.total - model.total:.4e} "
                          f"({executed.total / model.total:.2f}x model)",
                          "convention (MFU): causal attention counts its L(L+1)/2 allowed (query, key) pairs; "
                          f"PaLM/torchtitan count L^2: {palm.total:.4e} FLOPs/step "
                          f"({palm.total / model.total - 1:+.1%}), an MFU that much higher"]}
    if verify:
        counted = count_with_flop_counter(lambda: s.loss(batch).backward())
        error = abs(counted - executed.total) / executed.total
        report.update(counted_flops=counted, relative_error=error, verified=error <= TOLERANCE)
        verdict = "PASS" if error <= TOLERANCE else "FAIL"
        report["summary"].append(f"FlopCounterMode counted {counted:.4e} executed FLOPs; analytic "
                                 f"{executed.total:.4e}; relative error {error:.3%} "
                                 f"(tolerance {TOLERANCE:.0%}): {verdict}")
    return report
