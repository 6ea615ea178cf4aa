"""The model's Linear layers on the fastest CPU GEMM path: equal to F.linear forward and
backward, chosen by measurement (or the switch), and a no-op where it must be."""
import copy

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch import nn

from gemref.data.batches import batch_with_lengths
from gemref.train.presets import get_preset
from gemref.mfu.gemm_paths import MODEL_PATHS, check_fp32, check_path
from gemref.mfu.row_blocks import WHOLE_BELOW
from gemref.model.gem import GEMRef, ranking_loss
from gemref.precision import fast_linear as fl

pytestmark = pytest.mark.skipif(not check_fp32("onednn")[0], reason="no fp32 oneDNN path in this torch build")

ROWS = st.one_of(st.sampled_from([0, 1, 2]), st.integers(3, 300))       # skewed: many tiny, some long
PLANS = st.tuples(*[st.sampled_from(MODEL_PATHS)] * 3)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMREF_CACHE_DIR", str(tmp_path))
    return tmp_path


@settings(max_examples=40, deadline=None)
@given(rows=ROWS, lead=st.sampled_from([(), (3,), (2, 2)]), k=st.integers(1, 80), n=st.integers(1, 80),
       bias=st.booleans(), x_grad=st.booleans(), transposed=st.booleans(), plan=PLANS)
def test_fast_linear_equals_f_linear_forward_and_backward(rows, lead, k, n, bias, x_grad, transposed, plan):
    g = torch.Generator().manual_seed(rows * 7919 + k * 31 + n)
    shape = (*lead, rows, k)
    x = torch.randn(shape[::-1], generator=g).permute(*range(len(shape) - 1, -1, -1)) if transposed \
        else torch.randn(shape, generator=g)                   # transposed: a non-contiguous input
    w, b = torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(n, generator=g) if bias else None
    grad_out = torch.randn(*lead, rows, n, generator=g)
    results = []
    for linear in (lambda x_, w_, b_: fl.fast_linear(x_, w_, b_, plan), F.linear):
        leaves = [x.clone().requires_grad_(x_grad), nn.Parameter(w.clone())] + (
            [nn.Parameter(b.clone())] if bias else [])
        y = linear(leaves[0], leaves[1], leaves[2] if bias else None)
        wanted = [t for t in leaves if t.requires_grad]
        results.append((y, torch.autograd.grad(y, wanted, grad_out)))
    (y_fast, grads_fast), (y_ref, grads_ref) = results
    torch.testing.assert_close(y_fast, y_ref, rtol=1e-5, atol=1e-5)
    assert len(grads_fast) == len(grads_ref) == 1 + bias + x_grad
    for got, want in zip(grads_fast, grads_ref):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_a_model_on_onednn_trains_like_the_plain_one(monkeypatch, cache_dir):
    monkeypatch.setenv(fl.ENV, "onednn")
    cfg = get_preset("tiny").model
    batch = batch_with_lengths(cfg, [0, 1, 3, 64, 9, 2])
    plain = GEMRef(cfg, jagged=True)
    fast = copy.deepcopy(plain)
    report = fl.use_fastest_cpu_gemms(fast, "cpu")
    linears = [m for m in plain.modules() if isinstance(m, nn.Linear)]
    assert report["layers"] == len(linears) > 0 and all(type(m) is fl.FastLinear for m in fast.modules()
                                                           if isinstance(m, nn.Linear))
    assert fast.state_dict().keys() == plain.state_dict().keys()
    losses = [ranking_loss(m(batch), batch.labels) for m in (plain, fast)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_nothing_changes_off_cpu_with_the_switch_off_or_for_linear_subclasses(monkeypatch, cache_dir):
    class Other(nn.Linear):
        pass

    model = nn.Sequential(nn.Linear(4, 5), Other(5, 3))
    monkeypatch.setenv(fl.ENV, "bogus")          # ignored off CPU: the function does nothing there
    assert fl.use_fastest_cpu_gemms(model, "cuda")["layers"] == 0
    assert type(model[0]) is nn.Linear
    monkeypatch.setenv(fl.ENV, "blas")
    assert fl.use_fastest_cpu_gemms(model, "cpu")["layers"] == 0 and type(model[0]) is nn.Linear
    monkeypatch.setenv(fl.ENV, "onednn")
    assert fl.use_fastest_cpu_gemms(model, "cpu")["layers"] == 1
    assert type(model[0]) is fl.FastLinear and type(model[1]) is Other


def test_a_bad_switch_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(fl.ENV, "mkl")
    with pytest.raises(ValueError, match="GEMREF_CPU_GEMM='mkl'; valid: auto, blas, onednn"):
        fl.use_fastest_cpu_gemms(nn.Linear(2, 2), "cpu")


def test_autocast_and_empty_batches_take_f_linear():
    layer = nn.Linear(8, 4)
    layer.__class__, layer.plan = fl.FastLinear, ("onednn",) * 3
    x = torch.randn(5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
    empty = layer(torch.randn(0, 8, requires_grad=True))
    assert empty.shape == (0, 4) and "fastlinear" not in empty.grad_fn.name().lower()
    assert "fastlinear" in layer(x).grad_fn.name().lower()


def test_onednn_wins_a_role_only_when_clearly_faster():
    seconds = {"forward": {"blas": 1.0, "onednn": 0.5}, "grad_input": {"blas": 1.0, "onednn": 0.97},
               "grad_weight": {"blas": 1.0, "onednn": 1.4}}
    assert fl.plan_from_timings(seconds) == ["onednn", "blas", "blas"]


def test_the_plan_is_measured_once_and_cached_only_when_uncontended(monkeypatch, cache_dir):
    monkeypatch.setenv(fl.ENV, "auto")
    calls = []
    monkeypatch.setattr(fl, "measure_plan", lambda k, n, rows, dtype: calls.append((k, n)) or {
        "rows": rows, "seconds": {}, "plan": ["onednn", "blas", "onednn"]})
    monkeypatch.setattr(fl, "_with_cpu_share", lambda fn: (fn(), 0.5))
    assert fl.choose_plan(16, 8)[0] == ("onednn", "blas", "onednn")
    assert fl.choose_plan(16, 8)[1]["origin"].endswith("(contended: not cached)") and len(calls) == 2
    monkeypatch.setattr(fl, "_with_cpu_share", lambda fn: (fn(), 1.0))
    fl.choose_plan(16, 8)
    plan, how = fl.choose_plan(16, 8)
    assert len(calls) == 3 and how["origin"] == "cache" and plan == ("onednn", "blas", "onednn")


def test_without_a_usable_onednn_everything_stays_on_blas(monkeypatch):
    monkeypatch.setattr(fl, "check_path", lambda path, dtype: (False, f"not {dtype}: relative error 3e-03"))
    plan, how = fl.choose_plan(16, 8, mode="onednn")
    assert plan == ("blas",) * 3 and "not fp32" in how["onednn_unusable"]
    plan, how = fl.choose_plan(16, 8, mode="onednn", dtype="bf16")
    assert plan == ("blas",) * 3 and "not bf16" in how["onednn_unusable"]


def test_a_bad_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="dtype='fp16'; a Linear's GEMMs can be planned in: fp32, bf16"):
        fl.choose_plan(16, 8, dtype="fp16")
    with pytest.raises(ValueError, match="dtype='fp16'"):
        fl.use_fastest_cpu_gemms(nn.Linear(2, 2), "cpu", "fp16")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_real_measurement_gives_a_plan_for_each_role(dtype):
    out = fl.measure_plan(32, 24, rows=64, dtype=dtype)
    assert out["rows"] == 64 and out["dtype"] == dtype and len(out["plan"]) == 3
    assert set(out["plan"]) <= set(MODEL_PATHS)
    assert all(t > 0 for role in out["seconds"].values() for t in role.values())


def test_under_torch_compile_the_gemms_stay_on_the_plan():
    """Dynamo keeps the custom op in the graph (inductor fuses around it; the GEMM stays on the
    plan's path instead of inductor's BLAS lowering), and the compiled layer equals F.linear
    forward and backward."""
    layer = nn.Linear(8, 4)
    layer.__class__, layer.plan = fl.FastLinear, ("onednn",) * 3
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    x = torch.randn(6, 8)
    torch.testing.assert_close(torch.compile(layer, backend=backend)(x), F.linear(x, layer.weight, layer.bias))
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.fastlinear.forward.default in targets and torch._C._nn.linear not in targets
    torch._dynamo.reset()
    compiled = torch.compile(layer)
    x = torch.randn(3, 7, 8, requires_grad=True)
    got = compiled(x)
    got_grads = torch.autograd.grad(got.square().sum(), (x, layer.weight, layer.bias))
    want = F.linear(x, layer.weight, layer.bias)
    want_grads = torch.autograd.grad(want.square().sum(), (x, layer.weight, layer.bias))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-4)


def test_a_2d_output_is_not_a_view():
    """FSDP2 warns when a sharded module returns a view (the model's heads are a 2-D Linear)."""
    layer = nn.Linear(8, 2)
    layer.__class__, layer.plan = fl.FastLinear, ("onednn",) * 3
    x = torch.randn(5, 8, requires_grad=True)
    assert layer(x)._base is None
    assert layer(x.reshape(5, 1, 8)).shape == (5, 1, 2)


@pytest.mark.parametrize("x_grad", [True, False])
def test_flop_counter_sees_the_gemms_inside_the_custom_ops(x_grad):
    from torch.utils.flop_counter import FlopCounterMode
    m, k, n = 12, 5, 7
    x = torch.randn(m, k, requires_grad=x_grad)
    w = nn.Parameter(torch.randn(n, k))
    with FlopCounterMode(display=False) as counter:
        fl.fast_linear(x, w, None, ("onednn", "blas", "onednn")).sum().backward()
    gemms = 2 if x_grad else 1                         # forward + grad_W, plus grad_x when x needs it
    assert counter.get_total_flops() == 2 * m * k * n * (1 + gemms)


# ---------------------------------------------------------------------------- bf16 (autocast)
BF16_EPS = torch.finfo(torch.bfloat16).eps
BF16_ROWS = st.one_of(st.sampled_from([0, 1, 2]), st.integers(3, 300),
                      st.integers(WHOLE_BELOW - 2, 2 * WHOLE_BELOW + 600))   # skewed; the last run in row blocks


def _assert_within_bf16(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, what: str,
                        add: torch.Tensor | None = None) -> None:
    """got against a @ b (+ add) in float64 (a, b, add already bf16-rounded): |error| <=
    2 eps (|a| @ |b| + |add|) (the output's rounding plus fp32 accumulation, per element) + a
    floor of eps / 64 of the output's mean magnitude (an exactly-cancelling entry may carry
    rounding of its terms)."""
    want, scale = a.double() @ b.double(), a.double().abs() @ b.double().abs()
    if add is not None:
        want, scale = want + add.double(), scale + add.double().abs()
    floor = BF16_EPS / 64 * float(scale.mean()) if scale.numel() else 0.0
    err = (got.detach().double() - want).abs()
    assert bool((err <= 2 * BF16_EPS * scale + floor).all()), (what, float(err.max()), float(scale.max()))


@settings(max_examples=30, deadline=None)
@given(rows=BF16_ROWS, k=st.integers(1, 72), n=st.integers(1, 72), bias=st.booleans(), x_grad=st.booleans(),
       plan=PLANS)
def test_bf16_fast_linear_matches_a_float64_oracle_forward_and_backward(rows, k, n, bias, x_grad, plan):
    """Under CPU bf16 autocast the layer runs bf16 GEMMs (row blocks above WHOLE_BELOW rows) and
    hands the fp32 master weight an fp32 gradient; every result within bf16's bound of a float64
    GEMM of the same bf16-rounded operands."""
    if "onednn" in plan and not check_path("onednn", "bf16")[0]:
        pytest.skip("no bf16 oneDNN path in this torch build")
    g = torch.Generator().manual_seed(rows * 7919 + k * 31 + n)
    layer = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=g) / k ** 0.5)
        if bias:
            layer.bias.copy_(torch.randn(n, generator=g))
    layer.__class__, layer.plan, layer.plan_dtype = fl.FastLinear, plan, torch.bfloat16
    x = torch.randn(rows, k, generator=g).requires_grad_(x_grad)
    grad_out = torch.randn(rows, n, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16 and (rows == 0 or "fastlinear" in y.grad_fn.name().lower())
    (y.float() * grad_out).sum().backward()
    xb, wb, gb = x.detach().bfloat16(), layer.weight.detach().bfloat16(), grad_out.bfloat16()
    ones = torch.ones(rows, 1, dtype=torch.bfloat16)
    if bias:
        _assert_within_bf16(y, xb, wb.t(), "out", add=layer.bias.detach().bfloat16())
        assert layer.bias.grad.dtype == torch.float32
        _assert_within_bf16(layer.bias.grad[None, :], ones.t(), gb, "grad bias")
    else:
        _assert_within_bf16(y, xb, wb.t(), "out")
    assert layer.weight.grad.dtype == torch.float32
    _assert_within_bf16(layer.weight.grad, gb.t(), xb, "grad weight")
    if x_grad:
        assert x.grad.dtype == torch.float32
        _assert_within_bf16(x.grad, gb, wb, "grad input")


def test_a_bf16_plan_runs_under_bf16_autocast_only(cache_dir, monkeypatch):
    monkeypatch.setenv(fl.ENV, "onednn")
    if not check_path("onednn", "bf16")[0]:
        pytest.skip("no bf16 oneDNN path in this torch build")
    model = nn.Sequential(nn.Linear(8, 4))
    report = fl.use_fastest_cpu_gemms(model, "cpu", "bf16")
    assert report["dtype"] == "bf16" and model[0].plan_dtype == torch.bfloat16 and "(bfloat16)" in repr(model)
    x = torch.randn(5, 8, requires_grad=True)
    assert "fastlinear" not in model(x).grad_fn.name().lower()            # fp32 call: F.linear
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert "fastlinear" in model(x).grad_fn.name().lower()
        assert model(x.bfloat16()).dtype == torch.bfloat16


def test_a_bf16_model_trains_like_autocast_f_linear(cache_dir, monkeypatch):
    """The GEM-like model with bf16 FastLinear layers against the same model on autocast's own
    F.linear: the loss and every gradient agree to bf16 accuracy (both round to bf16; their
    GEMMs sum in a different order)."""
    monkeypatch.setenv(fl.ENV, "onednn")
    if not check_path("onednn", "bf16")[0]:
        pytest.skip("no bf16 oneDNN path in this torch build")
    cfg = get_preset("tiny").model
    batch = batch_with_lengths(cfg, [0, 1, 3, 64, 9, 2] * 40)           # > WHOLE_BELOW history rows
    plain = GEMRef(cfg, jagged=True)
    fast = copy.deepcopy(plain)
    fl.use_fastest_cpu_gemms(fast, "cpu", "bf16")
    losses = []
    for model in (plain, fast):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses.append(ranking_loss(model(batch), batch.labels))
        losses[-1].backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=2e-3)
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        if p.grad is not None:
            assert q.grad.dtype == torch.float32
            scale = float(p.grad.abs().max())
            torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0.1 * scale + 1e-6, msg=name)
