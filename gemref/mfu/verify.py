"""`gemref flops`: the per-component FLOP table of one training step, and its verification.

Verification runs one real training step (forward + backward) of the configured path under
torch's FlopCounterMode and compares the count with the analytic *executed* FLOPs of that
path (gemref/mfu/flops.py). They must agree within `TOLERANCE`; the report also states the
waste (executed - model FLOPs), i.e. what padding and materialised attention cost.
"""
from __future__ import annotations

from ..train import sample_batch, setup
from .flops import COMPONENTS, count_with_flop_counter, executed_flops, model_flops

TOLERANCE = 0.02


def flops_report(preset, train, *, device: str = "auto", verify: bool = False) -> dict:
    s = setup(preset, train, device=device)
    batch = sample_batch(s)
    cfg = s.preset.model
    model = model_flops(cfg, batch.lengths)
    executed = executed_flops(cfg, batch.lengths, jagged=train.jagged, kernel=s.kernel, device=s.device)
    rows = [{"component": c, "model_fwd": model.forward[c],
             "model_train": model.forward[c] + model.backward[c],
             "executed_train": executed.forward[c] + executed.backward[c]} for c in COMPONENTS]
    rows.append({"component": "total", "model_fwd": model.total_forward, "model_train": model.total,
                 "executed_train": executed.total})
    report = {"preset": s.preset.name, "batch_size": batch.batch_size, "tokens": batch.num_tokens,
              "jagged": train.jagged, "kernel": s.kernel, "components": rows,
              "model_flops": model.total, "executed_flops": executed.total,
              "waste_flops": executed.total - model.total,
              "summary": [f"model FLOPs/step {model.total:.4e} (train = 3 x forward, real lengths); "
                          f"executed {executed.total:.4e}; waste {executed.total - model.total:.4e} "
                          f"({executed.total / model.total:.2f}x model)"]}
    if verify:
        counted = count_with_flop_counter(lambda: s.loss(batch).backward())
        error = abs(counted - executed.total) / executed.total
        report.update(counted_flops=counted, relative_error=error, verified=error <= TOLERANCE)
        verdict = "PASS" if error <= TOLERANCE else "FAIL"
        report["summary"].append(f"FlopCounterMode counted {counted:.4e} executed FLOPs; analytic "
                                 f"{executed.total:.4e}; relative error {error:.3%} "
                                 f"(tolerance {TOLERANCE:.0%}): {verdict}")
    return report
