"""Id-only baselines fitted on a dataset's train split: what the GEM-like model has to beat.

Both predict one label column (0 click, 1 conversion) from ids alone, without the history:
  * `item_rate`: the candidate's smoothed positive rate in train,
    (positives_i + alpha * p) / (rows_i + alpha), p the train base rate (a candidate never seen
    in train gets p);
  * `logistic`: logistic regression on one-hot user and candidate ids plus a bias,
    minimising mean log loss + lambda / 2 * (|w_user|^2 + |w_item|^2) (the bias not
    penalised), fitted in float64 by L-BFGS (the objective is strictly convex: one optimum,
    whatever the start; the lambdas are fitted from the strongest down, each from the last).
The smoothing alpha and the penalty lambda are chosen on a validation split (`VALIDATION_SHARE`
of the train rows, drawn with a fixed seed), by its log loss; then the baseline is refitted on
the whole train split. Nothing here sees the eval split until `predict`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

ALPHAS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
LAMBDAS = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
VALIDATION_SHARE = 0.1
VALIDATION_SEED = 0
LBFGS_ITERATIONS = 500
GRADIENT_TOLERANCE = 1e-7    # stop when every partial derivative of the objective is below this


@dataclass(frozen=True)
class Ids:
    """One split, id-only: the user id and candidate id of every row and its 0/1 labels."""

    user: np.ndarray      # (N,) int64 in [0, n_users)
    item: np.ndarray      # (N,) int64 in [0, n_items)
    labels: np.ndarray    # (N, 2) float

    def take(self, rows: np.ndarray) -> "Ids":
        return Ids(self.user[rows], self.item[rows], self.labels[rows])


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    """Mean binary log loss (nats) of probabilities p for labels y, p clipped to [1e-12, 1 - 1e-12]."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def validation_rows(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit rows, validation rows) of an n-row train split."""
    order = np.random.default_rng(VALIDATION_SEED).permutation(n)
    cut = max(1, int(round(VALIDATION_SHARE * n)))
    return order[cut:], order[:cut]


@dataclass(frozen=True)
class ItemRate:
    alpha: float
    base: float
    rate: np.ndarray      # (n_items,) smoothed positive rate per candidate

    @staticmethod
    def fit(train: Ids, task: int, n_items: int, alpha: float) -> "ItemRate":
        y = train.labels[:, task].astype(np.float64)
        base = float(y.mean())
        positives = np.bincount(train.item, weights=y, minlength=n_items)
        rows = np.bincount(train.item, minlength=n_items)
        return ItemRate(alpha, base, (positives + alpha * base) / (rows + alpha))

    def predict(self, split: Ids) -> np.ndarray:
        return self.rate[split.item]


@dataclass(frozen=True)
class Logistic:
    lam: float
    bias: float
    user_w: np.ndarray    # (n_users,)
    item_w: np.ndarray    # (n_items,)

    @staticmethod
    def fit(train: Ids, task: int, n_users: int, n_items: int, lam: float,
            start: "Logistic | None" = None) -> "Logistic":
        """The penalised fit from zeros, or from `start` (a fit at another lambda: the same optimum,
        reached in fewer steps)."""
        y = torch.as_tensor(train.labels[:, task], dtype=torch.float64)
        user, item = torch.as_tensor(train.user), torch.as_tensor(train.item)
        init = ([start.bias], start.user_w, start.item_w) if start else (np.zeros(1), np.zeros(n_users), np.zeros(n_items))
        params = [torch.tensor(np.asarray(v, dtype=np.float64), requires_grad=True) for v in init]
        opt = torch.optim.LBFGS(params, lr=1.0, max_iter=LBFGS_ITERATIONS, tolerance_grad=GRADIENT_TOLERANCE,
                                tolerance_change=1e-14, history_size=20, line_search_fn="strong_wolfe")

        def objective():
            opt.zero_grad()
            b, wu, wi = params
            logits = b + wu[user] + wi[item]
            loss = F.binary_cross_entropy_with_logits(logits, y) + 0.5 * lam * (wu.square().sum() + wi.square().sum())
            loss.backward()
            return loss

        opt.step(objective)
        b, wu, wi = (p.detach().numpy() for p in params)
        return Logistic(lam, float(b[0]), wu.copy(), wi.copy())

    def predict(self, split: Ids) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(self.bias + self.user_w[split.user] + self.item_w[split.item])))


def fit_baselines(train: Ids, task: int, n_users: int, n_items: int) -> dict[str, ItemRate | Logistic]:
    """Both baselines for one task, each with the hyper-parameter its validation log loss chose,
    refitted on the whole train split."""
    fit_rows, val_rows = validation_rows(len(train.item))
    fit, val = train.take(fit_rows), train.take(val_rows)
    y = val.labels[:, task]
    alpha = min(ALPHAS, key=lambda a: log_loss(ItemRate.fit(fit, task, n_items, a).predict(val), y))
    fits, previous = {}, None
    for lam in sorted(LAMBDAS, reverse=True):     # the path from the strongest penalty, each fit starting at the last
        previous = fits[lam] = Logistic.fit(fit, task, n_users, n_items, lam, previous)
    lam = min(LAMBDAS, key=lambda v: log_loss(fits[v].predict(val), y))
    return {"item_rate": ItemRate.fit(train, task, n_items, alpha),
            "logistic": Logistic.fit(train, task, n_users, n_items, lam, fits[lam])}
