"""The training optimizer (gemref.train.make_optimizer): fused AdamW on CPU, equal to torch's
default AdamW within fp32 rounding, with the embedding tables out of weight decay."""
from __future__ import annotations

import copy

import torch

from gemref.train.presets import get_preset
from gemref.model.gem import GEMRef
from gemref.train import make_optimizer


def test_fused_adamw_matches_the_default_and_keeps_tables_out_of_weight_decay():
    preset = get_preset("tiny")
    train = preset.train
    model = GEMRef(preset.model, jagged=True, kernel="reference")
    twin, initial = copy.deepcopy(model), copy.deepcopy(model.state_dict())
    fused = make_optimizer(model, train)
    assert fused.defaults["fused"] is True
    groups = {id(p): g["weight_decay"] for g in fused.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert groups[id(p)] == (0.0 if name.startswith("tables.") else train.weight_decay), name
    # torch's default (for-loop) AdamW, same groups, as the oracle
    tables = [p for n, p in twin.named_parameters() if n.startswith("tables.")]
    dense = [p for n, p in twin.named_parameters() if not n.startswith("tables.")]
    plain = torch.optim.AdamW([{"params": dense, "weight_decay": train.weight_decay},
                               {"params": tables, "weight_decay": 0.0}], lr=train.lr, foreach=False)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        for (_, a), (_, b) in zip(model.named_parameters(), twin.named_parameters()):
            g = torch.randn(a.shape, generator=gen)
            a.grad, b.grad = g.clone(), g.clone()
        fused.step()
        plain.step()
    for (name, a), (_, b) in zip(model.named_parameters(), twin.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
        assert not torch.equal(a, initial[name]), f"{name} did not move"
