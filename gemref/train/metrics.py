"""Ranking-quality metrics: normalized entropy (NE) and ROC AUC, and the evaluation's result type.

NE (He et al., "Practical Lessons from Predicting Clicks on Ads at Facebook", 2014) is the
average log loss divided by the entropy of the base rate: NE < 1 means the model predicts
better than always answering the average click rate; lower is better.
"""
from __future__ import annotations

import math
from typing import TypedDict

import torch
import torch.nn.functional as F
from torch import Tensor


def normalized_entropy(logits: Tensor, labels: Tensor) -> float:
    """NE of one task: mean BCE(logits, labels) / H(mean label). ValueError if labels are constant."""
    labels = labels.double()
    p = float(labels.mean())
    if p <= 0.0 or p >= 1.0:
        raise ValueError(f"NE is undefined when every label is {int(p)} (base rate {p})")
    base = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    loss = float(F.binary_cross_entropy_with_logits(logits.double(), labels))
    return loss / base


def roc_auc(scores: Tensor, labels: Tensor) -> float:
    """P(score of a random positive > score of a random negative), ties counted half."""
    scores, labels = scores.double().flatten(), labels.flatten()
    n_pos = int(labels.sum())
    n_neg = labels.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both positive and negative labels")
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, scores.numel() + 1, dtype=scores.dtype)
    # Average the ranks of tied scores.
    unique, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    if unique.numel() < scores.numel():
        ends = torch.cumsum(counts, 0).to(scores.dtype)
        mean_rank = ends - (counts.to(scores.dtype) - 1) / 2
        ranks[order] = mean_rank[inverse]
    pos_rank_sum = float(ranks[labels.bool()].sum())
    return (pos_rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


class EvalResult(TypedDict):
    """NE and AUC per task after `step` training steps (gemref/train/loop.py `evaluate`)."""

    step: int
    eval_samples: int
    eval_loss: float
    ne_click: float
    auc_click: float
    ne_conversion: float
    auc_conversion: float
