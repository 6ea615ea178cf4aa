"""What the model tests share: skewed history lengths, one model's loss and gradients, and the
check that two layouts/kernels compute the same thing."""
from __future__ import annotations

import torch
from hypothesis import strategies as st

from gemref.model.config import ModelConfig
from gemref.data.batches import batch_with_lengths
from gemref.model.gem import GEMRef, ranking_loss


def skewed_lengths(max_len: int, max_size: int = 6):
    """History lengths: mostly short, sometimes the maximum, sometimes empty."""
    return st.lists(st.one_of(st.integers(0, 4), st.integers(0, max_len), st.just(max_len)),
                    min_size=1, max_size=max_size)


def loss_and_grads(cfg: ModelConfig, batch, jagged: bool, kernel: str = "reference"):
    """(loss, {parameter name: gradient}) of a freshly seeded model on one batch."""
    torch.manual_seed(0)
    model = GEMRef(cfg, jagged=jagged, kernel=kernel)
    loss = ranking_loss(model(batch), batch.labels)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_jagged_matches_padded(cfg: ModelConfig, lengths: list[int], kernel: str) -> None:
    """The jagged model with `kernel` gives the padded reference model's loss and gradients."""
    batch = batch_with_lengths(cfg, lengths)
    loss_p, grads_p = loss_and_grads(cfg, batch, jagged=False)
    loss_j, grads_j = loss_and_grads(cfg, batch, jagged=True, kernel=kernel)
    torch.testing.assert_close(loss_j, loss_p, rtol=1e-5, atol=1e-6)
    assert grads_p.keys() == grads_j.keys()
    for name in grads_p:
        torch.testing.assert_close(grads_j[name], grads_p[name], rtol=1e-4, atol=1e-6, msg=name)
