"""The price of one training sample for load balancing: c0 + c1*L + c2*L^2 for a history of L
events (`SampleCost`), input checks shared by the balancing code, and `calibrate`, which fits
the coefficients (in seconds) to measured step times by non-negative least squares.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

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
    """Cost of one training sample with a history of L events: per_sample + per_token*L + per_token_sq*L^2.

    Units are those of the coefficients: model FLOPs (forward + backward) when they come
    from gemref/mfu/flops.py (`sample_cost_coefficients(model_cfg)` gives
    (per_sample, per_token, per_token_sq) for a ModelConfig: dense layers on the
    non-sequence tokens, per-event projections/FFN, attention's 2*H*D*L^2 terms), or
    seconds when fitted by `calibrate` to measured step times.
    """

    per_sample: float      # c0: work independent of L (non-sequence tokens, cross, head)
    per_token: float       # c1: work per history event (projections, FFN)
    per_token_sq: float    # c2: work per L^2 (attention scores and values)

    def __post_init__(self) -> None:
        for name in ("per_sample", "per_token", "per_token_sq"):
            value = float(getattr(self, name))
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"SampleCost.{name} must be finite and >= 0, got {value}")

    def cost(self, lengths) -> np.ndarray:
        """(B,) history lengths -> (B,) float64 per-sample costs."""
        L = check_lengths(lengths).astype(np.float64)
        return self.per_sample + self.per_token * L + self.per_token_sq * L * L


@dataclass(frozen=True)
class Calibration:
    cost: SampleCost       # fitted per-sample coefficients (seconds)
    per_step: float        # fitted fixed time of a step, independent of its samples (seconds)
    rel_rms_error: float   # RMS of (fit - measured) / measured over the calibration batches


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns.

    The NNLS optimum is the unconstrained least-squares fit on its own support, so the best
    non-negative solution among the 2^k subset fits is the optimum (k <= 4 here: 16 solves).
    Columns are scaled to unit norm first (sums of L^2 dwarf sample counts).
    """
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
    """Fit time(batch) = per_step + sum over its samples of (c0 + c1*L + c2*L^2) by non-negative least squares.

    `lengths_list[i]` holds the history lengths of batch i, `measured_times[i]` its measured
    step time in seconds (take a median over repetitions). Batches should vary in size and
    length mix, or the columns (count, sum L, sum L^2) are collinear and the split between
    coefficients is arbitrary. `per_step=False` forces the fixed per-step time to 0.
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
    return Calibration(SampleCost(*x[:3]), float(x[3]) if per_step else 0.0, float(rel))
