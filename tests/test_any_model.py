"""Every technique through its documented public API on a model gemref did not define
(tests/my_rec.py's MyRec: its own batch type, its own loss, no gemref attribute names), one test
each, as a reader would call it in their own trainer:

    1 jagged attention   gdpa behind a 4-line adapter in place of MyRec's own attention
    2 load balancing     BalancedDistributedBatchSampler over MyRec's lengths + loss_divisor
    3 low precision      apply_precision with the default shape filter
    4 the MFU meter      mfu.foreign.count_step / measure (attention on the real lengths)
    5 torch.compile      compile_model(model, regions by name)
    6 AutoAC             profile_blocks / solve / apply_plan over named blocks
    7 FSDP2 + tables     shard_tables / apply_fsdp / sync_replica_grads on gloo ranks:
                         tests/test_parallel_any_model.py (spawned ranks, parity with one process)

Each checks what the technique must not change (loss and gradients against the plain model), or
what it must report, against an oracle that is not the technique's own code.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from my_rec import MyRec, RecBatch, make_batch, my_loss, with_attention
from gemref.attention import gdpa
from gemref.autoac import applied_plan, apply_plan, profile_blocks, remove_plan, solve
from gemref.balance import SampleCost, loss_divisor
from gemref.compile import compile_model
from gemref.data.sampler import BalancedDistributedBatchSampler
from gemref.mfu.foreign import count_step
from gemref.precision.apply import apply_precision

LENGTHS = [7, 0, 12, 3, 9, 1]
D, HEADS = 32, 2


def gdpa_attention(q, k, v, offsets):
    """The 4-line adapter: MyRec's (T, H, D) q/k/v and offsets, gemref's gdpa."""
    return gdpa(q, k, v, offsets, activation="softmax", causal=True, kernel="reference")


def model_with(attention=None, seed: int = 0) -> MyRec:
    torch.manual_seed(seed)
    model = MyRec(d=D, heads=HEADS)
    return model if attention is None else with_attention(model, attention)


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    loss = my_loss(model, batch)
    loss.backward()
    # a checkpoint wrapper shows in parameter names (as torch's checkpoint_wrapper's does); state_dict keys do not
    return loss.detach(), {n.replace("._checkpoint_wrapped_module", ""): p.grad.clone()
                           for n, p in model.named_parameters() if p.grad is not None}


def assert_same(a, b, tol=1e-5):
    (la, ga), (lb, gb) = a, b
    assert torch.allclose(la, lb, rtol=tol, atol=tol)
    assert ga.keys() == gb.keys()
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=tol, atol=tol * max(1.0, float(gb[name].abs().max()))), name


def test_1_gdpa_replaces_the_models_own_attention():
    batch = make_batch(LENGTHS)
    assert_same(loss_and_grads(model_with(gdpa_attention), batch), loss_and_grads(model_with(), batch))


def test_2_balanced_sampler_and_the_loss_rule_give_the_global_gradient():
    lengths = [1, 2, 30, 4, 25, 3, 2, 40, 5, 1, 2, 3]
    world, global_batch = 3, len(lengths)
    parts = [next(iter(BalancedDistributedBatchSampler(lengths, global_batch, SampleCost(per_token=1.0,
                                                                                          per_token_sq=0.1),
                                                          rank=r, world_size=world, policy="kk", shuffle=False)))
             for r in range(world)]
    assert sorted(i for p in parts for i in p) == list(range(global_batch))
    assert len({len(p) for p in parts}) > 1                       # balanced by cost, not by count
    full = make_batch(lengths, seed=1)
    summed = None
    for part in parts:
        model = model_with(gdpa_attention)
        sub = _select(full, part)
        loss = F.binary_cross_entropy_with_logits(model(sub), sub.labels, reduction="sum")
        (loss / loss_divisor(global_batch, world, "sum")).backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        summed = grads if summed is None else {n: summed[n] + grads.get(n, 0) for n in summed}
    _, reference = loss_and_grads(model_with(gdpa_attention), full)
    for name, g in reference.items():
        assert torch.allclose(summed[name], g, atol=1e-6, rtol=1e-5), name


def _select(b: RecBatch, idx: list[int]) -> RecBatch:
    """The samples `idx` of a batch, as MyRec's user would cut them."""
    items = [b.items[int(b.offsets[i]):int(b.offsets[i + 1])] for i in idx]
    users = [b.users[int(b.user_offsets[i]):int(b.user_offsets[i + 1])] for i in idx]
    offsets = torch.tensor([0] + [len(x) for x in items]).cumsum(0)
    user_offsets = torch.tensor([0] + [len(x) for x in users]).cumsum(0)
    return RecBatch(torch.cat(items), offsets, torch.cat(users), user_offsets, b.labels[idx])


def test_3_low_precision_converts_the_linears_its_filter_keeps():
    model = model_with()
    report = apply_precision(model, "float8_rowwise", device="cpu")
    converted = {c.fqn for c in report.conversions}
    # by hand: K and N >= 64 and multiples of 16 -> the MLP's up (32 -> 128) fails K, the head's
    # first Linear (64 -> 64) passes; qkv/proj/down have a side of 32
    assert converted == {"head.0"}
    loss = my_loss(model, make_batch(LENGTHS))
    loss.backward()
    assert torch.isfinite(loss) and model.head[0].weight.grad is not None


def test_4_the_meter_counts_attention_on_the_real_lengths():
    batch = make_batch(LENGTHS)
    count = count_step(model_with(gdpa_attention), my_loss, batch)
    T, B = sum(LENGTHS), len(LENGTHS)
    linears = 2 * T * (D * 3 * D + D * D + D * 4 * D + 4 * D * D) * 2 + 2 * B * (2 * D * 64 + 64)
    attention = 2 * 4 * (D // HEADS) * HEADS * sum(L * (L + 1) // 2 for L in LENGTHS)   # 2 blocks
    assert count.model == 3 * (linears + attention)
    assert count.attention_model == 3 * attention


def test_5_compile_takes_regions_by_name():
    batch = make_batch(LENGTHS)
    eager = loss_and_grads(model_with(gdpa_attention), batch)
    compiled = model_with(gdpa_attention)
    compile_model(compiled, ["head"])
    assert_same(loss_and_grads(compiled, batch), eager)


def test_6_autoac_profiles_solves_and_applies_over_named_blocks():
    batch = make_batch(LENGTHS)
    model = model_with(gdpa_attention)
    plain = loss_and_grads(model, batch)
    profile = profile_blocks(model, ["stack.0", "stack.1"], lambda: my_loss(model, batch), repeats=1)
    plan = solve(profile, budget_bytes=profile.base_bytes // 2)
    apply_plan(model, plan)
    assert applied_plan(model) and set(applied_plan(model)) <= {"stack.0", "stack.1"}
    assert_same(loss_and_grads(model, batch), plain)
    remove_plan(model)
    assert applied_plan(model) == {}
