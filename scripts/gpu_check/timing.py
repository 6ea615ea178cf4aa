"""GPU check, section "timing": every Triton GDPA variant's forward and backward, side by side.

Causal self-attention at L = 2048, D = 128, H = 16, bf16, about 16384 rows: "fixed" (8
sequences of 2048) and "skewed" (gemref.data.lengths.make_lengths: one at 2048, the others
2048 u^4). Forward = the gemref::gdpa_triton_fwd op alone; backward = gemref::gdpa_triton_bwd
alone (softmax's delta included), both triton.testing.do_bench medians; rounds go over the
variants in turn (A B C ... A B C), and the median over rounds is reported with every round.
Model TFLOP/s use attention_model_flops (causal: L^2/2 per sequence; backward = 2x forward),
executed TFLOP/s the tiles the variant really runs. Each variant's outputs are compared with
the base variant's (max abs difference) as a large-shape sanity check. Softmax ceilings:
gemref's "sdpa" kernel (FlashAttention-2 varlen inside torch), torch.nn.attention.varlen_attn
where it exists, and for fixed lengths dense SDPA with the flash and cuDNN backends.
The variants are gemref.attention.testing.VARIANTS. --dry-run: the same on CPU in the Triton
interpreter, L = 32, D = 16, H = 1, one profile, DRY_VARIANTS only (base and every flag at once).
"""
from __future__ import annotations

import inspect
import statistics

from .common import Result, bench_ms, device, error_text, parse_args

ROUNDS = 2


def triton_fns(q, k, v, do, off, activation, spec):
    """(forward, backward) callables of one variant, and its outputs (out, dq, dk, dv)."""
    import torch

    args = (off, off, activation, True, 0, q.shape[-1] ** -0.5, 1.0, spec)
    fwd = lambda: torch.ops.gemref.gdpa_triton_fwd(q, k, v, *args)  # noqa: E731
    out, lse = fwd()
    saved = out if activation == "softmax" else lse
    bwd = lambda: torch.ops.gemref.gdpa_triton_bwd(do, q, k, v, saved, lse, *args)  # noqa: E731
    return fwd, bwd, (out, *bwd())


def ceilings(off, lengths):
    """{name: forward(q, k, v)} of torch's softmax attention kernels (some may not run here)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from gemref.attention import gdpa

    fns = {"sdpa (gemref kernel)": lambda a, b, c: gdpa(a, b, c, off, activation="softmax", causal=True,
                                                        kernel="sdpa", max_len=max(lengths))}
    try:
        from torch.nn.attention.varlen import varlen_attn
        cu = off.to(torch.int32)
        # causal: window_size=(-1, 0) in newer torch, is_causal=True where that is the keyword
        causal = ({"window_size": (-1, 0)} if "window_size" in inspect.signature(varlen_attn).parameters
                  else {"is_causal": True})
        fns["torch varlen_attn"] = lambda a, b, c: varlen_attn(a, b, c, cu, cu, max(lengths), max(lengths),
                                                               **causal)
    except ImportError:
        pass
    if len(set(lengths)) == 1:   # dense (B, H, L, D) for fixed lengths
        dense = lambda x: x.view(len(lengths), lengths[0], *x.shape[1:]).transpose(1, 2)  # noqa: E731
        for name, backend in (("dense sdpa flash", SDPBackend.FLASH_ATTENTION),
                              ("dense sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
            def attend(a, b, c, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(dense(a), dense(b), dense(c), is_causal=True)
            fns[name] = attend
    return fns


def with_grad(forward, q, k, v, do):
    """(forward without autograd, backward of one recorded forward) of forward(q, k, v)."""
    import torch

    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    out = forward(*leaves)
    grad = do if out.shape == do.shape else do.view(out.shape[0], out.shape[2], *do.shape[1:]).transpose(1, 2)

    def fwd():
        with torch.no_grad():
            return forward(q, k, v)
    return fwd, lambda: torch.autograd.grad(out, leaves, grad, retain_graph=True)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    import torch

    from gemref.attention import KERNELS, attention_model_flops
    from gemref.attention.testing import DRY_VARIANTS, VARIANTS
    from gemref.attention.triton.op import triton_executed_flops
    from gemref.data.lengths import make_lengths

    dev = device(args.dry_run)
    L, D, H, tokens = (32, 16, 1, 48) if args.dry_run else (2048, 128, 16, 16384)
    profiles = ("skewed",) if args.dry_run else ("fixed", "skewed")
    result = Result(args.result, rows=[], config={"max_len": L, "head_dim": D, "heads": H, "tokens": tokens,
                                                  "dtype": "bfloat16", "causal": True, "rounds": ROUNDS,
                                                  "variants": VARIANTS})
    gen = torch.Generator().manual_seed(0)
    for profile in profiles:
        lengths = make_lengths(profile, L, tokens, seed=0)
        off = torch.tensor([0] + lengths, device=dev).cumsum(0)
        lengths_t = torch.tensor(lengths, device=dev)
        T = int(off[-1])
        q, k, v, do = (torch.randn(T, H, D, generator=gen).to(dev, torch.bfloat16) for _ in range(4))
        model_fwd = attention_model_flops(lengths, lengths, H, D, True, None)
        for activation in ("silu", "softmax"):
            fns, meta, base_out = {}, {}, None
            for name, spec in VARIANTS.items():
                if (name == "silu_tanh" and activation == "softmax") or (args.dry_run and name not in DRY_VARIANTS):
                    continue
                try:
                    fwd, bwd, outs = triton_fns(q, k, v, do, off, activation, spec)
                    base_out = base_out or outs
                    fwd_exec, bwd_exec = triton_executed_flops(lengths_t, lengths_t, H, D, True, None, variant=spec)
                    meta[name] = {"executed": (fwd_exec, bwd_exec), "max_abs_diff_vs_base": {
                        n: float((a.float() - b.float()).abs().max()) for n, a, b in
                        zip(("out", "dq", "dk", "dv"), outs, base_out)}}
                    fns[name] = (fwd, bwd)
                except Exception as e:   # noqa: BLE001  (a variant that fails is reported, the rest timed)
                    result.append("rows", {"profile": profile, "activation": activation, "kernel": name,
                                           "error": error_text(e)})
            if activation == "softmax":
                for name, forward in ceilings(off, lengths).items():
                    try:
                        fwd, bwd = with_grad(forward, q, k, v, do)
                        fwd(), bwd()
                        executed = KERNELS["sdpa"].executed_flops(lengths_t, lengths_t, H, D, True, None)
                        fns[name], meta[name] = (fwd, bwd), {"executed": executed, "ceiling": True}
                    except Exception as e:   # noqa: BLE001  (a backend this GPU/torch lacks)
                        result.append("rows", {"profile": profile, "activation": activation, "kernel": name,
                                               "error": error_text(e)})
            times = {(name, p): [] for name in fns for p in ("fwd", "bwd")}
            for _ in range(1 if args.dry_run else ROUNDS):
                for name, (fwd, bwd) in fns.items():
                    times[(name, "fwd")].append(bench_ms(fwd, dev))
                    times[(name, "bwd")].append(bench_ms(bwd, dev))
            for name in fns:
                row = {"profile": profile, "activation": activation, "kernel": name,
                       "batch": len(lengths), "tokens": T, **{k: v for k, v in meta[name].items() if k != "executed"}}
                for p, model in (("fwd", model_fwd), ("bwd", 2 * model_fwd)):
                    ms = statistics.median(times[(name, p)])
                    executed = meta[name]["executed"][0 if p == "fwd" else 1]
                    row.update({f"{p}_ms": ms, f"{p}_ms_rounds": times[(name, p)],
                                f"{p}_model_tflops": model / (ms * 1e-3) / 1e12,
                                f"{p}_executed_tflops": executed / (ms * 1e-3) / 1e12})
                result.append("rows", row)
                print(f"{profile} {activation} {name}: fwd {row['fwd_model_tflops']:.1f} bwd "
                      f"{row['bwd_model_tflops']:.1f} model TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
