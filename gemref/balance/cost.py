"""What one training sample costs, as a function of its history length L (chapter 06): what the
balancer equalises across ranks, in any one unit. `SampleCost` c0 + c1*L + c2*L^2 in the
coefficients' unit (FLOPs: gemref/mfu/flops.py `sample_cost_coefficients`); `calibrate` for a
model you bring: time your step on a dozen batches of varied size and length mix, fit seconds by
non-negative least squares, read `r2` before trusting it; or any callable lengths (B,) -> costs
(B,). `sample_costs(cost, lengths)` prices lengths with any of them (a `Calibration` too)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, Union

import numpy as np


def _refuse(name: str, arr: np.ndarray, bad_mask: np.ndarray, what: str) -> None:
    if (bad := np.flatnonzero(bad_mask)).size:
        raise ValueError(f"{name}[{bad[0]}]={arr[bad[0]]} {what}")


def check_lengths(lengths, name: str = "lengths") -> np.ndarray:
    """1-D non-negative integer history lengths -> int64 array; ValueError names the first bad index."""
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind == "f":
        _refuse(name, arr, ~np.isfinite(arr) | (arr != np.round(arr)), "is not a finite integer")
    elif arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    _refuse(name, arr, arr < 0, "is negative")
    return arr


def check_costs(costs, name: str = "costs") -> np.ndarray:
    """1-D finite non-negative costs -> float64 array; ValueError names the first bad index."""
    arr = np.asarray(costs, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    _refuse(name, arr, ~np.isfinite(arr) | (arr < 0), "is not a finite non-negative number")
    return arr


@dataclass(frozen=True)
class SampleCost:
    """Cost of a sample with a history of L events: per_sample + per_token*L + per_token_sq*L^2,
    in the coefficients' unit (seconds from `calibrate`, or FLOPs of forward + backward)."""

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
        """L where the L^2 term overtakes the L term (per_token / per_token_sq); None without one."""
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
    cost = cost.cost if isinstance(cost, Calibration) else cost
    if isinstance(cost, SampleCost):
        return cost.cost(L)
    if not callable(cost):
        raise ValueError(f"cost must be a SampleCost, a Calibration or a callable lengths -> costs, "
                         f"got {type(cost).__name__}")
    out = check_costs(cost(L), "cost(lengths)")
    if out.shape != L.shape:
        raise ValueError(f"cost(lengths) returned {out.shape[0]} costs for {L.shape[0]} lengths")
    return out


def nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns: the optimum is the plain fit on
    its own support, so try all 2^k supports (k <= 4). Columns scaled to unit norm (sum L^2 >> count)."""
    k = A.shape[1]
    norms = np.linalg.norm(A, axis=0)
    norms[norms == 0] = 1.0
    As, best, best_rss = A / norms, np.zeros(k), float(y @ y)
    for cols in ([j for j in range(k) if mask >> j & 1] for mask in range(1, 2 ** k)):
        x = np.zeros(k)
        x[cols] = np.linalg.lstsq(As[:, cols], y, rcond=None)[0]
        if np.all(x >= 0) and (rss := float(np.sum((As @ x - y) ** 2))) < best_rss:
            best, best_rss = x, rss
    return best / norms


def calibrate(lengths_list: Sequence, measured_times: Sequence[float], per_step: bool = True) -> Calibration:
    """Fit time(batch i) = per_step + sum over lengths_list[i] of (c0 + c1*L + c2*L^2) to
    measured_times[i] (seconds, medians) by non-negative least squares. Vary batch size and length
    mix, or the columns (count, sum L, sum L^2) are collinear; a low `r2` says the quadratic does
    not explain your step. `per_step=False` forces the fixed time to 0."""
    if len(lengths_list) != len(measured_times):
        raise ValueError(f"lengths_list has {len(lengths_list)} batches but measured_times has {len(measured_times)}")
    times = check_costs(measured_times, "measured_times")
    Ls = [check_lengths(L, f"lengths_list[{i}]").astype(np.float64) for i, L in enumerate(lengths_list)]
    A = np.array([[len(L), L.sum(), (L * L).sum()] + [1.0] * per_step for L in Ls]).reshape(len(Ls), 3 + per_step)
    if len(Ls) < A.shape[1]:
        raise ValueError(f"calibrate needs at least {A.shape[1]} batches, got {len(Ls)}")
    x = nnls(A, times)
    fit = A @ x
    rel = np.sqrt(np.mean(((fit - times) / np.where(times > 0, times, 1.0)) ** 2))
    total = float(np.sum((times - times.mean()) ** 2))
    r2 = 1.0 - float(np.sum((fit - times) ** 2)) / total if total > 0 else 1.0
    return Calibration(SampleCost(*x[:3]), float(x[3]) if per_step else 0.0, float(rel), r2)
