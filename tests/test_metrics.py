import math

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from gemref.train.metrics import normalized_entropy, roc_auc


def brute_auc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 1)), min_size=2, max_size=30))
def test_auc_matches_pairwise_count_with_ties(pairs):
    scores, labels = zip(*pairs)
    assume(len(set(labels)) == 2)   # AUC needs a positive and a negative
    got = roc_auc(torch.tensor(scores, dtype=torch.float32), torch.tensor(labels, dtype=torch.float32))
    assert got == pytest.approx(brute_auc(scores, labels))


def test_ne_of_the_base_rate_is_one():
    labels = torch.tensor([1.0, 0, 0, 0])
    logit = math.log(0.25 / 0.75)
    assert normalized_entropy(torch.full((4,), logit), labels) == pytest.approx(1.0)
    assert normalized_entropy(torch.tensor([5.0, -5, -5, -5]), labels) < 0.1


def test_undefined_metrics_raise():
    with pytest.raises(ValueError, match="every label"):
        normalized_entropy(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="both positive and negative"):
        roc_auc(torch.zeros(3), torch.ones(3))
