"""gemref/mfu/foreign.py on models gemref did not define: the TorchRec example ranker
(gemref/interop/example_model.py) and a plain torch module. The FLOPs oracle is hand
arithmetic of the example's linears and attention on drawn jagged lengths (no meter code);
MFU is checked against hand arithmetic of the record's FLOPs, times and peak; padded and
jagged lengths meter differently; the op classes sum to the profiled step; the switches
(jagged gdpa, a compiled region) apply and AutoAC refuses, as documented. Tests that need
TorchRec skip without it; the plain-module tests (any nn.Module; gdpa windowed) run everywhere, and so
do those on tests/my_rec.py's MyRec with its attention swapped for gdpa: its model FLOPs are the hand
count on the real lengths for every kernel this CPU runs, padded kernels included."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from gemref.interop import lib
from gemref.mfu.foreign import count_model_flops, measure
from gemref.mfu.op_classes import CLASSES
from gemref.mfu.peak import Peak

HAVE_TORCHREC = lib.available()
needs_torchrec = pytest.mark.skipif(not HAVE_TORCHREC, reason="TorchRec is not installed (requirements-nodeps.txt)")
PEAK = Peak(1e11, "a made-up peak for the arithmetic", "fp32")    # FLOP/s; skips the CPU probe
D, HEADS, F, N_DENSE, HIDDEN = 32, 2, 2, 4, 64                   # the example's defaults


def oracle_step_flops(lengths: list[int]) -> int:
    """3 x the example's forward matmul FLOPs, by hand (its module doc)."""
    T, B = sum(lengths), len(lengths)
    linears = 2 * T * D * 3 * D + 2 * T * D * D + 2 * T * D * 2 * D + 2 * B * D * D
    head_in = (F + 2) * D + N_DENSE
    linears += 2 * B * head_in * HIDDEN + 2 * B * HIDDEN * 1
    self_pairs = sum(L * (L + 1) // 2 for L in lengths)           # causal, diagonal included
    cross_pairs = sum(lengths)                                    # one ad query per sample
    attention = 2 * 2 * D * (self_pairs + cross_pairs)           # QK^T and PV, 2 H D per pair each (H D = d)
    return 3 * (linears + attention)


def drawn_lengths(seed: int, batch: int = 12, max_len: int = 48) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (batch,), generator=g)
    lengths[0] = 0                                                # an empty history
    return [int(x) for x in lengths]


def example(kernel: str = "auto", seed: int = 0):
    from gemref.interop.example_model import ExampleRanker
    torch.manual_seed(seed)
    return ExampleRanker(kernel=kernel)


@needs_torchrec
@pytest.mark.parametrize("kernel", ["cpu_fused", "cpu_jagged"])
def test_model_flops_are_the_hand_count_on_real_lengths(kernel):
    from gemref.interop.example_model import example_batch, example_loss
    model = example(kernel)
    for seed in range(3):
        lengths = drawn_lengths(seed)
        assert count_model_flops(model, example_loss, example_batch(lengths, seed=seed)) == oracle_step_flops(lengths)


@needs_torchrec
def test_gdpa_registers_executed_flops_which_the_meter_replaces_by_model_flops():
    """FlopCounterMode alone sees gdpa's kernel formula (executed work: tiles); the meter counts
    the real lengths' pairs instead."""
    from gemref.interop.example_model import example_batch, example_loss
    model, lengths = example("cpu_fused"), drawn_lengths(7)
    batch = example_batch(lengths)
    with torch.no_grad(), FlopCounterMode(display=False) as plain:
        example_loss(model, batch)
    by_op = {str(op): n for op, n in plain.get_flop_counts()["Global"].items()}
    assert by_op.get("gemref.cpu_fused_fwd", 0) > 0, by_op
    assert 3 * plain.get_total_flops() > count_model_flops(model, example_loss, batch) == oracle_step_flops(lengths)


@needs_torchrec
def test_padded_and_jagged_lengths_meter_differently():
    from gemref.interop.example_model import example_batch, example_loss
    model, lengths = example(), drawn_lengths(3)
    padded = [max(lengths)] * len(lengths)
    jagged_flops = count_model_flops(model, example_loss, example_batch(lengths))
    padded_flops = count_model_flops(model, example_loss, example_batch(padded))
    assert jagged_flops == oracle_step_flops(lengths) < padded_flops == oracle_step_flops(padded)


def check_record(record, lengths: list[list[int]] | None) -> None:
    """MFU by hand from the record's FLOPs, times and peak; op classes summing to the profiled step."""
    steps = record.steps
    flops = sum(s.model_flops for s in steps)
    wall = sum(s.wall_s for s in steps)
    compute = sum(s.wall_s - s.data_s for s in steps)             # one process: the steps' own time
    fig = record.figures
    assert fig["mfu"] == pytest.approx(flops / (wall * PEAK.flops), rel=1e-12)
    assert fig["local_mfu"] == pytest.approx(flops / (compute * PEAK.flops), rel=1e-12)
    assert fig["scaling_ratio"] == pytest.approx(compute / wall, rel=1e-12)
    assert fig["mfu"] == pytest.approx(fig["local_mfu"] * fig["scaling_ratio"], rel=1e-12)
    if lengths is not None:
        assert [s.model_flops for s in steps] == [oracle_step_flops(ls) for ls in lengths]
        assert [s.tokens for s in steps] == [sum(ls) for ls in lengths]
    assert all(s.executed_flops > 0 for s in steps)
    assert set(record.op_seconds) == set(CLASSES) and min(record.op_seconds.values()) >= 0
    assert sum(record.op_seconds.values()) == pytest.approx(record.profiled_step_s, rel=1e-9)
    assert record.op_seconds["gemm"] > 0 and record.op_seconds["optimizer"] > 0


@needs_torchrec
def test_measure_gives_flops_mfu_and_op_classes_of_the_example():
    from gemref.interop.example_model import example_batch, example_lengths, example_loss
    model = example()
    lengths = [drawn_lengths(s) for s in range(4)]
    batches = [example_batch(ls, seed=s) for s, ls in enumerate(lengths)]
    record = measure(model, example_loss, batches, torch.optim.Adam(model.parameters(), 1e-3),
                     lengths_of=example_lengths, warmup=1, peak=PEAK)
    check_record(record, lengths[1:])
    assert record.op_seconds["attention"] > 0                    # gdpa's custom op ran, on the KJT's offsets
    assert len(record.losses) == 4 and all(l == l for l in record.losses)


@needs_torchrec
def test_a_compiled_region_keeps_the_flops_and_compiles_once():
    """gemref/compile/apply.py's compile_model on the example's dense region, its `mix` method, by name."""
    from gemref.compile import compile_model
    from gemref.interop.example_model import example_batch, example_lengths, example_loss
    model = example()
    stats = compile_model(model, ["mix"])
    assert stats.regions == ["mix"]
    lengths = [drawn_lengths(s, batch=8) for s in range(3)]
    batches = [example_batch(ls, seed=s) for s, ls in enumerate(lengths)]
    record = measure(model, example_loss, batches, torch.optim.Adam(model.parameters(), 1e-3),
                     lengths_of=example_lengths, peak=PEAK)
    check_record(record, lengths[1:])
    assert stats.graphs >= 1 and stats.recompiles == 0, stats


@needs_torchrec
def test_autoac_takes_the_blocks_the_caller_names_and_refuses_others():
    """AutoAC checkpoints the module paths it is given (gemref/autoac/): GEMRef's names are
    nowhere here, and a name the model lacks is a ValueError naming it."""
    from gemref.autoac import applied_plan, apply_plan, remove_plan
    model = example()
    with pytest.raises(ValueError, match="no block 'layers.0.sequence'"):
        apply_plan(model, {"layers.0.sequence": "full"})
    name = next(n for n, m in model.named_modules() if n and "." not in n and any(True for _ in m.parameters()))
    apply_plan(model, {name: "full"})
    assert applied_plan(model) == {name: "full"}
    remove_plan(model)
    assert not applied_plan(model)


def test_measure_meters_a_plain_torch_module_without_torchrec():
    """Any nn.Module: linears only, hand-counted (batch B of width 16 -> 32 -> 1)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    batches = [(torch.randn(b, 16), torch.rand(b)) for b in (8, 24, 40)]
    loss_fn = lambda m, batch: nn.functional.mse_loss(m(batch[0]).squeeze(1), batch[1])
    record = measure(model, loss_fn, batches, torch.optim.SGD(model.parameters(), 0.1),
                     lengths_of=lambda batch: torch.ones(batch[0].shape[0], dtype=torch.int64), peak=PEAK)
    check_record(record, None)
    assert [s.model_flops for s in record.steps] == [3 * (2 * b * 16 * 32 + 2 * b * 32) for b in (24, 40)]
    assert [s.samples for s in record.steps] == [24, 40]
    with pytest.raises(ValueError, match="at least 2"):
        measure(model, loss_fn, batches[:1], torch.optim.SGD(model.parameters(), 0.1),
                lengths_of=lambda batch: torch.ones(1), peak=PEAK)


@pytest.mark.parametrize("kernel,window", [("cpu_jagged", None), ("cpu_jagged", 5), ("cpu_fused", None)])
def test_gdpa_in_a_plain_module_counts_the_allowed_pairs(kernel, window):
    """A module of one Linear and one causal gdpa call, no TorchRec: the sliding window's pairs
    by hand, sum over positions i of min(i + 1, W)."""
    d, heads = 16, 2

    class Tower(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)

        def forward(self, x, offsets):
            from gemref.attention import gdpa
            q, k, v = self.qkv(x).view(x.shape[0], 3, heads, d // heads).unbind(1)
            return gdpa(q, k, v, offsets, causal=True, window=window, kernel=kernel)

    lengths = drawn_lengths(11, batch=6, max_len=20)
    offsets = torch.tensor([0] + lengths).cumsum(0)
    T = sum(lengths)
    batch = (torch.randn(T, d), offsets)
    loss_fn = lambda m, b: m(*b).square().mean()
    pairs = sum(min(i + 1, window or L) for L in lengths for i in range(L))
    assert count_model_flops(Tower(), loss_fn, batch) == 3 * (2 * T * d * 3 * d + 2 * 2 * d * pairs)


# ---------------------------------------------------------------- MyRec (tests/my_rec.py) with gdpa
MY_D, MY_HEADS, MY_HIDDEN, MY_BLOCKS = 32, 2, 64, 2               # MyRec's defaults
MY_LENGTHS = [0, 5, 17, 3, 40, 1, 22, 9]


def my_rec_linears(lengths: list[int]) -> int:
    """MyRec's forward Linear FLOPs by hand: per block qkv, proj, up, down on T tokens; the head on B."""
    T, B, d = sum(lengths), len(lengths), MY_D
    return MY_BLOCKS * 2 * T * (d * 3 * d + d * d + d * 4 * d + 4 * d * d) + 2 * B * (2 * d * MY_HIDDEN + MY_HIDDEN)


def gdpa_attention(kernel: str, activation: str):
    """The 4-line adapter a user writes: Block.attention's signature onto gdpa (causal, jagged)."""
    from gemref.attention import gdpa

    def attention(q, k, v, offsets):
        return gdpa(q, k, v, offsets, activation=activation, causal=True, kernel=kernel)
    return attention


def cpu_case(kernel: str) -> tuple[str, torch.dtype] | None:
    """(activation, dtype) this kernel runs MyRec's causal attention in on this CPU (softmax first)."""
    from gemref.attention import KERNELS
    for activation, dtype in (("softmax", torch.float32), ("silu", torch.float32), ("silu", torch.bfloat16)):
        if KERNELS[kernel].unavailable(torch.empty(0, MY_HEADS, MY_D // MY_HEADS, dtype=dtype), activation,
                                       True, None) is None:
            return activation, dtype
    return None


def my_rec_with_gdpa(kernel: str):
    from my_rec import MyRec
    case = cpu_case(kernel)
    if case is None:
        from gemref.attention import KERNELS
        pytest.skip(f"{kernel}: " + KERNELS[kernel].unavailable(torch.empty(0, 2, 16), "softmax", True, None))
    torch.manual_seed(0)
    model = MyRec().to(case[1])
    for block in model.stack:
        block.attention = gdpa_attention(kernel, case[0])
    return model


@pytest.mark.parametrize("kernel", ["reference", "sdpa", "cpu_jagged", "cpu_fused", "cpu_fused_amx",
                                    "flash_attn", "triton"])
def test_my_rec_model_flops_are_the_real_lengths_whatever_kernel_ran(kernel):
    """MyRec with its attention swapped for gdpa: model FLOPs = the linears on T tokens + the causal
    pairs sum L(L+1)/2 (x3), for every kernel that runs on this CPU, the padded ones (reference's
    rectangle, sdpa's CPU buckets) included; executed FLOPs (fwd + bwd) are at least that."""
    from my_rec import make_batch, my_loss
    from gemref.mfu.foreign import count_executed_flops, count_step
    model, batch = my_rec_with_gdpa(kernel), make_batch(MY_LENGTHS)
    attention = MY_BLOCKS * 2 * 2 * MY_D * sum(L * (L + 1) // 2 for L in MY_LENGTHS)
    step = count_step(model, my_loss, batch)
    assert step.model == 3 * (my_rec_linears(MY_LENGTHS) + attention)
    assert step.attention_model == 3 * attention and step.gdpa_calls == MY_BLOCKS
    executed = count_executed_flops(model, my_loss, batch)
    assert executed >= step.model
    assert all(p.grad is None for p in model.parameters())


def test_padded_kernels_set_their_padding_aside():
    """reference and CPU sdpa run padded matmuls (FlopCounterMode sees more than the real pairs);
    the meter sets that count aside, and a plain FlopCounterMode forward would have over-credited it."""
    from my_rec import make_batch, my_loss
    from gemref.mfu.foreign import count_step
    batch = make_batch(MY_LENGTHS)
    for kernel in ("reference", "sdpa"):
        model = my_rec_with_gdpa(kernel)
        step = count_step(model, my_loss, batch)
        assert step.attention_set_aside > step.attention_model
        with torch.no_grad(), FlopCounterMode(display=False) as plain:
            my_loss(model, batch)
        assert 3 * plain.get_total_flops() == step.model - step.attention_model + step.attention_set_aside


def test_the_users_own_attention_counts_as_it_ran():
    """MyRec as written (its own einsum attention, no gdpa): its matmuls count as they ran, the
    full L x L scores of each sequence (the mask is applied after the matmul). No length 1: there
    torch's einsum multiplies without a matmul, which FlopCounterMode does not count."""
    from my_rec import MyRec, make_batch, my_loss
    from gemref.mfu.foreign import count_step
    torch.manual_seed(0)
    lengths = [L for L in MY_LENGTHS if L != 1]
    step = count_step(MyRec(), my_loss, make_batch(lengths))
    full = MY_BLOCKS * 2 * 2 * MY_D * sum(L * L for L in lengths)
    assert step.model == 3 * (my_rec_linears(lengths) + full) and step.gdpa_calls == 0


def test_gdpa_counts_only_inside_a_meters_tally():
    from gemref.attention import counting_attention
    from gemref.attention.flops import counting
    q = torch.randn(6, 2, 8)
    offsets = torch.tensor([0, 2, 6])
    assert not counting()
    with counting_attention() as outer, counting_attention() as inner:
        assert counting()
        gdpa_attention("cpu_jagged", "softmax")(q, q, q, offsets)
    assert not counting()
    assert outer == inner and outer.calls == 1 and outer.model_flops == 2 * 2 * 2 * 8 * (3 + 10)


def test_measure_reports_waste_on_my_rec():
    from my_rec import make_batch, my_loss
    model = my_rec_with_gdpa("sdpa")
    lengths = [MY_LENGTHS, MY_LENGTHS[::-1], [4, 4, 30]]
    record = measure(model, my_loss, [make_batch(ls, seed=s) for s, ls in enumerate(lengths)],
                     torch.optim.SGD(model.parameters(), 0.1), lengths_of=lambda b: b.lengths, peak=PEAK)
    check_record(record, None)
    assert [s.model_flops for s in record.steps] == [
        3 * (my_rec_linears(ls) + MY_BLOCKS * 4 * MY_D * sum(L * (L + 1) // 2 for L in ls)) for ls in lengths[1:]]
    assert record.waste_flops_per_step == record.executed_flops_per_step - record.model_flops_per_step > 0


def test_compiled_blocks_are_counted_as_eager_ones():
    """MyRec's blocks (gdpa inside) compiled by name: after a compiled step the meter's model FLOPs
    are still the real lengths' count, and counting them does not recompile the blocks."""
    from my_rec import make_batch, my_loss
    from gemref.compile import compile_model
    from gemref.mfu.foreign import count_step
    model = my_rec_with_gdpa("sdpa")
    stats = compile_model(model, ["stack.*"])
    my_loss(model, make_batch(MY_LENGTHS)).backward()
    graphs = stats.graphs
    step = count_step(model, my_loss, make_batch(MY_LENGTHS))
    attention = MY_BLOCKS * 2 * 2 * MY_D * sum(L * (L + 1) // 2 for L in MY_LENGTHS)
    assert step.model == 3 * (my_rec_linears(MY_LENGTHS) + attention) and step.gdpa_calls == MY_BLOCKS
    my_loss(model, make_batch(MY_LENGTHS[::-1], seed=1)).backward()
    assert graphs > 0 and stats.graphs == graphs and stats.recompiles == 0
