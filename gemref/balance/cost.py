"""What one training sample costs, as a function of its history length L (chapter 06).

A cost is what the balancer equalises across ranks; any unit works as long as every sample of
a batch is priced in the same one. Three ways to give it:

* `SampleCost(per_sample, per_token, per_token_sq)`: cost = c0 + c1*L + c2*L^2. Units are the
  coefficients' (seconds when fitted by `calibrate`, FLOPs when counted by a FLOP formula:
  gemref's own model uses gemref/mfu/flops.py `sample_cost_coefficients`);
* `calibrate(lengths_list, measured_times)`: the documented way for a model you bring. Time
  your training step on a dozen batches of varied size and length mix, fit the coefficients
  (seconds) by non-negative least squares, and read `r2` before trusting the fit;
* any callable `lengths (B,) int64 -> costs (B,)`, e.g. a lookup of measured per-length times.

`sample_costs(cost, lengths)` prices lengths with any of the three (a `Calibration` too).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, Union

import numpy as np


def check_lengths(lengths, name: str = "lengths") -> np.ndarray:
    """1-D non-negative integer history lengths -> int64 array; ValueError names the first bad index."""
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if bad.size:
            raise ValueError(f"{name}[{bad[0]}]={arr[bad[0]]} is not a finite integer")
    elif arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero(arr < 0)
    if bad.size:
        raise ValueError(f"{name}[{bad[0]}]={arr[bad[0]]} is negative")
    return arr


def check_costs(costs, name: str = "costs") -> np.ndarray:
    """1-D finite non-negative costs -> float64 array; ValueError names the first bad index."""
    arr = np.asarray(costs, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
    if bad.size:
        raise ValueError(f"{name}[{bad[0]}]={arr[bad[0]]} is not a finite non-negative number")
    return arr


@dataclass(frozen=True)
class SampleCost:
    """Cost of a sample with a history of L events: per_sample + per_token*L + per_token_sq*L^2,
    in the coefficients' unit (seconds from `calibrate`, or FLOPs of forward + backward).
    `SampleCost(per_token=a, per_token_sq=b)` is a*L + b*L^2."""

    per_sample: float = 0.0      # c0: work independent of L (non-sequence features, head)
    per_token: float = 0.0       # c1: work per history event (projections, FFN)
    per_token_sq: float = 0.0    # c2: work per pair of events (attention)

    def __post_init__(self) -> None:
        for name in ("per_sample", "per_token", "per_token_sq"):
            value = float(getattr(self, name))
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"SampleCost.{name} must be finite and >= 0, got {value}")

    def cost(self, lengths) -> np.ndarray:
        """(B,) history lengths -> (B,) float64 per-sample costs."""
        L = check_lengths(lengths).astype(np.float64)
        return self.per_sample + self.per_token * L + self.per_token_sq * L * L

    def crossover_length(self) -> float | None:
        """The length L at which the L^2 term equals the L term (per_token / per_token_sq): above it
        a sample's attention costs more than its per-event work; None without an L^2 term."""
        return self.per_token / self.per_token_sq if self.per_token_sq > 0 else None


@dataclass(frozen=True)
class Calibration:
    cost: SampleCost       # fitted per-sample coefficients (seconds)
    per_step: float        # fitted fixed time of a step, whatever its samples (seconds)
    rel_rms_error: float   # RMS of (fit - measured) / measured over the calibration batches
    r2: float              # 1 - residual / total sum of squares (1.0 = the model explains every time)


CostLike = Union[SampleCost, Calibration, Callable[[np.ndarray], Sequence[float]]]


def sample_costs(cost: CostLike, lengths) -> np.ndarray:
    """(B,) float64 costs of samples with these history lengths, priced by a SampleCost, a
    Calibration or a callable; ValueError when `cost` is none of them or returns bad costs."""
    L = check_lengths(lengths)
    if isinstance(cost, Calibration):
        cost = cost.cost
    if isinstance(cost, SampleCost):
        return cost.cost(L)
    if not callable(cost):
        raise ValueError(f"cost must be a SampleCost, a Calibration or a callable lengths -> costs, "
                         f"got {type(cost).__name__}")
    out = check_costs(cost(L), "cost(lengths)")
    if out.shape != L.shape:
        raise ValueError(f"cost(lengths) returned {out.shape[0]} costs for {L.shape[0]} lengths")
    return out


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns: the optimum is the plain
    least-squares fit on its own support, so the best non-negative fit over the 2^k supports is
    it (k <= 4: 15 solves). Columns are scaled to unit norm first (sums of L^2 dwarf counts)."""
    k = A.shape[1]
    norms = np.linalg.norm(A, axis=0)
    norms[norms == 0] = 1.0
    As = A / norms
    best, best_rss = np.zeros(k), float(y @ y)
    for mask in range(1, 2 ** k):
        cols = [j for j in range(k) if mask >> j & 1]
        x_sub, *_ = np.linalg.lstsq(As[:, cols], y, rcond=None)
        if np.any(x_sub < 0):
            continue
        x = np.zeros(k)
        x[cols] = x_sub
        rss = float(np.sum((As @ x - y) ** 2))
        if rss < best_rss:
            best, best_rss = x, rss
    return best / norms


def calibrate(lengths_list: Sequence, measured_times: Sequence[float], per_step: bool = True) -> Calibration:
    """Fit time(batch) = per_step + sum over its samples of (c0 + c1*L + c2*L^2) by non-negative
    least squares; seconds in, seconds out.

    `lengths_list[i]` holds the history lengths of batch i, `measured_times[i]` its measured step
    time (a median over repetitions). Vary batch size and length mix, or the columns (count,
    sum L, sum L^2) are collinear and the split between coefficients is arbitrary; a low `r2`
    says the quadratic does not explain your step. `per_step=False` forces the fixed time to 0.
    """
    if len(lengths_list) != len(measured_times):
        raise ValueError(f"lengths_list has {len(lengths_list)} batches but measured_times has {len(measured_times)}")
    times = check_costs(measured_times, "measured_times")
    rows = []
    for i, lengths in enumerate(lengths_list):
        L = check_lengths(lengths, f"lengths_list[{i}]").astype(np.float64)
        rows.append([len(L), L.sum(), (L * L).sum()] + ([1.0] if per_step else []))
    A = np.asarray(rows, dtype=np.float64).reshape(len(rows), 4 if per_step else 3)
    if len(rows) < A.shape[1]:
        raise ValueError(f"calibrate needs at least {A.shape[1]} batches, got {len(rows)}")
    x = _nnls(A, times)
    fit = A @ x
    rel = np.sqrt(np.mean(((fit - times) / np.where(times > 0, times, 1.0)) ** 2))
    total = float(np.sum((times - times.mean()) ** 2))
    r2 = 1.0 - float(np.sum((fit - times) ** 2)) / total if total > 0 else 1.0
    return Calibration(SampleCost(*x[:3]), float(x[3]) if per_step else 0.0, float(rel), r2)


def explained_by(cost: CostLike, lengths_list: Sequence, measured_times: Sequence[float]) -> float:
    """R^2 of measured step times against time = a + k x (the batch's summed `cost`), a and k >= 0
    fitted: how much of the measured times a cost in another unit (FLOPs, say) explains."""
    times = check_costs(measured_times, "measured_times")
    if len(lengths_list) != len(times) or len(times) < 3:
        raise ValueError(f"explained_by needs >= 3 batches and one time each, got {len(lengths_list)} and {len(times)}")
    A = np.array([[float(sample_costs(cost, L).sum()), 1.0] for L in lengths_list])
    fit = A @ _nnls(A, times)
    total = float(np.sum((times - times.mean()) ** 2))
    return 1.0 - float(np.sum((fit - times) ** 2)) / total if total > 0 else 1.0
