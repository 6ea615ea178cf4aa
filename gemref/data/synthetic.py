"""Synthetic ads events with a hidden teacher, so a ranking model has something real to learn.

Every sample is one user seeing one candidate ad:
  * a user history of L events (item id, action type, time-gap bucket). L follows the
    length profile: "skewed" is log-normal (most histories short) with a heavy tail that
    piles up at max_len, as real histories truncated to max_len do; "uniform" and "fixed"
    are there for controlled experiments;
  * F non-sequence categorical features, one id per table, Zipf-distributed;
  * dense float features; the candidate ad (an item id); click and conversion labels.

The teacher: each user has a hidden interest vector u; history items are drawn from item
categories aligned with u (Gumbel-max over category affinities), then by Zipf rank inside
the category. The labels depend on
  * the history: h = action-weighted mean of the history's category vectors, recency-weighted;
  * the cross of history with non-sequence features: <h, ad vector>, <h, feature vectors>;
  * the non-sequence side alone: a feature x ad interaction and a linear dense term.
Click ~ Bernoulli(sigmoid(logit)); conversion needs signal on top of a click-like logit.

Determinism: every random draw comes from numpy Generators seeded by (seed, split, shard),
so the same seed gives the same data, bit for bit, whatever the shard order or worker count.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import LENGTH_PROFILES, DataConfig, DataShape

TEACHER_DIM = 8          # width of the hidden vectors
N_CATEGORIES = 64        # item categories (item id % N_CATEGORIES)
SPLITS = {"train": 0, "eval": 1}
ACTION_WEIGHTS = np.array([1.0, 2.0, 3.0, 0.5, 1.5, 2.5, 1.0, 0.8])  # indexed by action id % 8


def draw_lengths(profile: str, n: int, max_len: int, median: int, sigma: float = 1.1,
                 seed: int | np.random.Generator = 0) -> np.ndarray:
    """(n,) int64 history lengths from a length profile, deterministic for `seed` (or a Generator).

    - skewed: ceil(exp(N(log median, sigma))), truncated to [1, max_len]. The truncation
      leaves a spike at max_len, like real histories cut to their last max_len events.
    - uniform: integers uniform on [1, max_len].
    - fixed: every sample has `median` events.
    """
    if profile not in LENGTH_PROFILES:
        raise ValueError(f"profile={profile!r}; valid: {', '.join(LENGTH_PROFILES)}")
    if n < 0 or max_len < 1:
        raise ValueError(f"need n >= 0 and max_len >= 1, got n={n}, max_len={max_len}")
    if not 1 <= median <= max_len:
        raise ValueError(f"median={median} must be in [1, max_len={max_len}]")
    if not (np.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be finite and > 0, got {sigma}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    if profile == "fixed":
        return np.full(n, median, dtype=np.int64)
    if profile == "uniform":
        return rng.integers(1, max_len + 1, size=n, dtype=np.int64)
    raw = rng.lognormal(mean=np.log(median), sigma=sigma, size=n)
    return np.clip(np.ceil(raw), 1, max_len).astype(np.int64)


def zipf_ids(rng: np.random.Generator, size, vocab: int, a: float) -> np.ndarray:
    """Ids in [0, vocab) with P(id = r) roughly proportional to (r + 1)^-a (truncated Pareto inverse CDF)."""
    u = rng.random(size)
    if abs(a - 1.0) < 1e-9:
        r = np.exp(u * np.log(vocab + 1.0))
    else:
        top = (vocab + 1.0) ** (1.0 - a)
        r = (1.0 + u * (top - 1.0)) ** (1.0 / (1.0 - a))
    return np.minimum(np.floor(r).astype(np.int64) - 1, vocab - 1)


@dataclass
class Teacher:
    """Hidden parameters that define the labels; fixed by the data seed."""

    category_vecs: np.ndarray        # (N_CATEGORIES, TEACHER_DIM)
    feature_vecs: list[np.ndarray]   # per sparse table: (buckets, TEACHER_DIM), indexed by id % buckets
    dense_w: np.ndarray              # (n_dense,)
    click_bias: float
    conv_bias: float

    @staticmethod
    def create(model: DataShape, data: DataConfig) -> "Teacher":
        rng = np.random.default_rng([data.seed, 7919])
        cats = rng.normal(size=(N_CATEGORIES, TEACHER_DIM)) / np.sqrt(TEACHER_DIM) * 2.0
        feats = [rng.normal(size=(min(v, 97), TEACHER_DIM)) / np.sqrt(TEACHER_DIM) for v in model.sparse_vocab]
        dense_w = rng.normal(size=model.n_dense) * 0.4
        teacher = Teacher(cats, feats, dense_w, 0.0, 0.0)
        # Calibrate the biases on a fixed calibration draw so the click rate is ~pos_rate.
        cal = teacher.sample(model, data, np.random.default_rng([data.seed, 104729]), 4096)
        teacher.click_bias = _bias_for_rate(cal["click_logit"], data.pos_rate)
        teacher.conv_bias = _bias_for_rate(cal["conv_logit"], data.pos_rate / 4)
        return teacher

    def sample(self, model: DataShape, data: DataConfig, rng: np.random.Generator, n: int) -> dict:
        """Draw n samples: features, history and (bias-free) label logits."""
        lengths = draw_lengths(data.length_profile, n, model.max_len, min(data.median_len, model.max_len),
                               data.len_sigma, rng)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        T = int(offsets[-1])
        owner = np.repeat(np.arange(n), lengths)

        interest = rng.normal(size=(n, TEACHER_DIM))
        affinity = interest @ self.category_vecs.T                       # (n, C)
        gumbel = rng.gumbel(size=(T, N_CATEGORIES))
        category = np.argmax(affinity[owner] * 1.5 + gumbel, axis=1)     # (T,)
        per_cat = max(model.item_vocab // N_CATEGORIES, 1)
        rank = zipf_ids(rng, T, per_cat, data.zipf_a)
        items = np.minimum(rank * N_CATEGORIES + category, model.item_vocab - 1)
        actions = zipf_ids(rng, T, model.action_vocab, 1.5)
        gaps = np.minimum(rng.geometric(0.25, size=T) - 1, model.time_buckets - 1).astype(np.int64)

        # History summary h: action-weighted, recency-weighted mean of category vectors.
        w = ACTION_WEIGHTS[actions % len(ACTION_WEIGHTS)] * np.exp(-gaps / 8.0)
        vecs = self.category_vecs[items % N_CATEGORIES] * w[:, None]
        h = np.zeros((n, TEACHER_DIM))
        np.add.at(h, owner, vecs)
        h /= np.maximum(np.bincount(owner, weights=w, minlength=n), 1e-6)[:, None]

        aligned = rng.random(n) < 0.5   # half the ads are targeted at the user's interest
        ad_cat = np.where(aligned, np.argmax(affinity + rng.gumbel(size=affinity.shape), axis=1),
                          rng.integers(0, N_CATEGORIES, size=n))
        ad_ids = np.minimum(zipf_ids(rng, n, per_cat, data.zipf_a) * N_CATEGORIES + ad_cat,
                            model.item_vocab - 1)
        sparse = np.stack([zipf_ids(rng, n, v, data.zipf_a) for v in model.sparse_vocab], axis=1)
        dense = rng.normal(size=(n, model.n_dense)).astype(np.float32)

        ad_vec = self.category_vecs[ad_ids % N_CATEGORIES]
        f0 = self.feature_vecs[0][sparse[:, 0] % len(self.feature_vecs[0])]
        f1 = self.feature_vecs[-1][sparse[:, -1] % len(self.feature_vecs[-1])]
        hist_x_ad = np.sum(h * ad_vec, axis=1)
        hist_x_feature = np.sum(h * f0, axis=1)
        feature_x_ad = np.sum(f1 * ad_vec, axis=1)
        click_logit = 2.0 * hist_x_ad + 1.0 * hist_x_feature + 0.7 * feature_x_ad + dense @ self.dense_w
        conv_logit = 0.8 * click_logit + 1.2 * np.sum(h * f1, axis=1)
        return dict(lengths=lengths, offsets=offsets, items=items, actions=actions, gaps=gaps,
                    sparse=sparse, dense=dense, ad_ids=ad_ids,
                    click_logit=click_logit, conv_logit=conv_logit)

    def draw(self, model: DataShape, data: DataConfig, split: str, shard: int, n: int) -> dict:
        """One shard's samples with labels; deterministic in (data.seed, split, shard)."""
        rng = np.random.default_rng([data.seed, SPLITS[split], shard])
        s = self.sample(model, data, rng, n)
        s["click"] = (rng.random(n) < _sigmoid(s.pop("click_logit") + self.click_bias)).astype(np.int8)
        s["conversion"] = (rng.random(n) < _sigmoid(s.pop("conv_logit") + self.conv_bias)).astype(np.int8)
        return s


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _bias_for_rate(logits: np.ndarray, rate: float) -> float:
    """The bias b with mean(sigmoid(logits + b)) == rate (bisection)."""
    lo, hi = -30.0, 30.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if _sigmoid(logits + mid).mean() < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2

