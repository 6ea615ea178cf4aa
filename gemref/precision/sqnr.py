"""How much signal a low-precision path keeps: SQNR against a high-precision twin.

Quantisation is judged as torchao judges it: by the signal-to-quantisation-noise ratio
  sqnr(ref, approx) = 20 log10(||ref|| / ||ref - approx||)   in dB,
between a high-precision model and a twin with copied weights, for the output and for both
gradients. Rough scale: each bit of mantissa is worth ~6 dB; an FP8 E4M3 cast of
well-scaled data sits near 30 dB, E5M2 near 25 dB, bf16 near 50 dB.
"""
from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from .apply import apply_precision


def sqnr(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """SQNR of `approx` against `ref` in dB (inf when identical; computed in float64)."""
    if ref.shape != approx.shape:
        raise ValueError(f"sqnr needs equal shapes, got {tuple(ref.shape)} and {tuple(approx.shape)}")
    ref64, approx64 = ref.detach().double(), approx.detach().double()
    noise = (ref64 - approx64).norm().item()
    signal = ref64.norm().item()
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 20 * math.log10(signal / noise)


@dataclass
class LinearSQNR:
    output_db: float
    input_grad_db: float
    weight_grad_db: float
    kernel: str            # "native" or "emulated": which path produced the low-precision side


def compare_linear(layer_hp: nn.Linear, precision: str, x: torch.Tensor, *,
                   grad_output: torch.Tensor | None = None, kernel: str = "auto",
                   seed: int = 0) -> LinearSQNR:
    """Run `layer_hp` and a `precision` twin (copied weights) on x; SQNR of output and grads.

    grad_output defaults to a standard normal drawn with `seed`. layer_hp is not modified.
    """
    if not isinstance(layer_hp, nn.Linear):
        raise ValueError(f"compare_linear needs an nn.Linear, got {type(layer_hp).__name__}")
    if x.shape[-1] != layer_hp.in_features:
        raise ValueError(f"x has {x.shape[-1]} features, the layer takes {layer_hp.in_features}")
    device = layer_hp.weight.device
    ref, twin = copy.deepcopy(layer_hp), nn.Sequential(copy.deepcopy(layer_hp))
    report = apply_precision(twin, precision, device=device, kernel=kernel, min_dim=0)
    if report.skipped:
        raise ValueError(f"layer cannot run in {precision}: {report.skipped[0].reason}")
    if grad_output is None:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        shape = (*x.shape[:-1], layer_hp.out_features)
        grad_output = torch.randn(shape, generator=gen).to(device=device, dtype=x.dtype)
    x_ref = x.detach().clone().requires_grad_()
    x_lp = x.detach().clone().requires_grad_()
    y_ref = ref(x_ref)
    with report.autocast():
        y_lp = twin(x_lp)
    y_ref.backward(grad_output)
    y_lp.backward(grad_output.to(y_lp.dtype))
    return LinearSQNR(sqnr(y_ref, y_lp.to(y_ref.dtype)), sqnr(x_ref.grad, x_lp.grad),
                      sqnr(ref.weight.grad, twin[0].weight.grad.to(ref.weight.dtype)), report.kernel)


@dataclass
class LayerSQNR:
    fqn: str
    output_db: float        # the layer's output inside the low-precision model vs the hp model
    input_grad_db: float    # grad w.r.t. the layer's input (nan where it needs none)
    weight_grad_db: float


def model_sqnr(model_hp: nn.Module, precision: str, inputs: Sequence[torch.Tensor],
               loss_fn: Callable[[torch.Tensor], torch.Tensor], *, kernel: str = "auto",
               **precision_kwargs) -> tuple[list[LayerSQNR], float]:
    """Per-layer SQNR of a whole model on one batch, by twin: a deep copy of model_hp is
    converted with apply_precision, both run `loss_fn(model(*inputs))` forward and backward,
    and every converted layer's output, input grad and weight grad is compared with its
    high-precision counterpart. Errors compound through depth, as they do in training.

    Returns (one LayerSQNR per converted layer in module order, SQNR of the model output).
    Input grads come from full backward hooks: layers whose output is then modified in
    place (e.g. ReLU(inplace=True)) cannot be hooked that way.
    """
    device = next(model_hp.parameters()).device
    ref, twin = copy.deepcopy(model_hp), copy.deepcopy(model_hp)  # model_hp stays untouched
    for p in (*ref.parameters(), *twin.parameters()):
        p.grad = None
    report = apply_precision(twin, precision, device=device, kernel=kernel, **precision_kwargs)
    names = set(report.converted)
    records: list[dict[str, dict[str, torch.Tensor]]] = [{}, {}]
    handles = []
    for model, rec in zip((ref, twin), records):
        for fqn, module in model.named_modules():
            if fqn in names:
                rec[fqn] = {}
                handles.append(module.register_forward_hook(_keep_output(rec[fqn])))
                handles.append(module.register_full_backward_hook(_keep_input_grad(rec[fqn])))
    try:
        with warnings.catch_warnings():  # a first layer whose input needs no grad is expected
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            out_hp = ref(*inputs)
            loss_fn(out_hp).backward()
            with report.autocast():
                out_lp = twin(*inputs)
                loss_lp = loss_fn(out_lp)
            loss_lp.backward()
    finally:
        for h in handles:
            h.remove()
    layers = []
    for fqn in report.converted:
        hp, lp = records[0][fqn], records[1][fqn]
        w_hp, w_lp = ref.get_submodule(fqn).weight.grad, twin.get_submodule(fqn).weight.grad
        g_hp, g_lp = hp.get("input_grad"), lp.get("input_grad")
        input_grad_db = math.nan if g_hp is None else sqnr(g_hp, g_lp.to(g_hp.dtype))
        layers.append(LayerSQNR(fqn, sqnr(hp["output"], lp["output"].to(hp["output"].dtype)),
                                input_grad_db, sqnr(w_hp, w_lp.to(w_hp.dtype))))
    return layers, sqnr(out_hp, out_lp.to(out_hp.dtype))


def _keep_output(store: dict) -> Callable:
    def hook(module, args, output):
        store["output"] = output.detach()
    return hook


def _keep_input_grad(store: dict) -> Callable:
    def hook(module, grad_input, grad_output):
        if grad_input[0] is not None:
            store["input_grad"] = grad_input[0].detach()
    return hook
