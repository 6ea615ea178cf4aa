"""Quality on a real dataset: eval NE and AUC over seeds per rung and technique, beside id-only baselines.

On `--dataset DIR` (e.g. MovieLens-100K from `gemref data movielens`), with the --preset's
architecture, `--seeds` training runs of `--steps-per-run` steps per variant (seeds 0..N-1, the
variants interleaved within each seed), each evaluated on the WHOLE eval split:

    fast        rungs 1-2 (jagged, the fused attention kernel `auto` picks), fp32: the
                reference whose seed band judges the others. Rungs 3-6 (compile, AutoAC,
                load balance, FSDP) change how a step runs, not what it computes (AutoAC's
                larger batch aside), so this is the math of the best rung a CPU runs
    baseline    rung 0: eager, padded to max_len, materialised attention (--variants to skip:
                it is the slowest by far)
    mxfp8       rung 7's MXFP8 GEMMs (emulated off Blackwell: the numerics, not the speed)
    window      windowed sequence attention, W = max_len // 8 (as `waterfall --with window`)
    compressed  every block's saved activations stored as MXFP8 (`--ac-compress mxfp8`)

Beside them, computed on the same split: the train base rate (a constant), the candidate's
smoothed like-rate and a logistic regression on user and candidate ids (gemref/data/baselines.py;
hyper-parameters chosen on a validation part of train). NE (gemref/report/metrics.py) is the
mean log loss over the entropy of the eval split's own base rate: 1 is the eval base rate,
so the constant train rate scores above 1 where the rate drifts. A variant is inside the
reference's seed band when its mean is within k standard errors of the difference of means
(gemref/report/seed_band.py). The user table is the sparse table named "user" in the
manifest's dataset section, else sparse_0.
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, replace

import numpy as np
import torch

from ..config import PRESETS, Preset, override
from ..data.baselines import Ids, fit_baselines
from ..data.folder import dataset_preset, described_manifest
from ..errors import UsageError
from ..runtime.files import atomic_write_text, write_json
from ..model import TASKS
from ..options import add_dataset_arg, add_device_arg, device_of, int_at_least, output_dir, output_file, positive_int
from ..report import format_table, markdown_table
from ..report.metrics import normalized_entropy, roc_auc
from ..report.seed_band import K_SE, seed_band_rows
from ..train import run as train_run
from ..waterfall import provenance

VARIANTS = ("fast", "baseline", "mxfp8", "window", "compressed")
METRICS = tuple(f"{m}_{t}" for t in TASKS for m in ("ne", "auc"))
WINDOW_FRACTION = 8


def variant_run(preset: Preset, variant: str) -> tuple[Preset, dict]:
    """(the preset, TrainConfig changes) of a variant (module doc)."""
    fast = {"jagged": True, "kernel": "auto"}
    if variant == "window":
        return replace(preset, model=override(preset.model, window=max(1, preset.model.max_len // WINDOW_FRACTION))), fast
    return preset, {"fast": fast, "baseline": {"jagged": False, "kernel": "reference"},
                    "mxfp8": {**fast, "precision": "mxfp8"}, "compressed": {**fast, "ac_compress": "mxfp8"}}[variant]


def train_and_evaluate(preset: Preset, variant: str, seed: int, steps: int, device: str = "cpu") -> dict:
    """One training run of a variant; NE/AUC of both tasks on the whole eval split."""
    p, changes = variant_run(preset, variant)
    batches = math.ceil(p.data.n_eval / p.train.batch_size)
    t0 = time.perf_counter()
    record = train_run(p, override(p.train, steps=steps, seed=seed, eval_batches=batches, **changes), device=device,
                       progress=False, measure_memory=False)
    ev = record["eval"]
    return {"variant": variant, "seed": seed, **{m: float(ev[m]) for m in METRICS},
            "eval_samples": ev["eval_samples"], "median_step_s": record["median_step_s"],
            "wall_s": time.perf_counter() - t0, "dtype": record["dtype"], "kernel": record["resolved"]["kernel"]}


def user_table(section: dict) -> int:
    names = section.get("sparse_names") or []
    return names.index("user") if "user" in names else 0


def baseline_rows(preset: Preset, section: dict) -> list[dict]:
    """The constant, the candidate's rate and the logistic regression: NE/AUC per task on eval."""
    from ..train.compose import datasets

    train_set, eval_set = datasets(preset)
    f = user_table(section)
    ids = [Ids(d.sparse[:, f], d.ad_ids, d.labels.astype(np.float64)) for d in (train_set, eval_set)]
    n_users, n_items = preset.data.sparse_vocab[f], preset.data.item_vocab
    rows = {name: {"variant": name, "seed": None} for name in ("train base rate", "candidate rate", "logistic u+i")}
    for t, task in enumerate(TASKS):
        y = torch.as_tensor(ids[1].labels[:, t])
        fitted = fit_baselines(ids[0], t, n_users, n_items)
        base = float(ids[0].labels[:, t].mean())
        for name, p in (("train base rate", np.full(len(y), base)), ("candidate rate", fitted["item_rate"].predict(ids[1])),
                        ("logistic u+i", fitted["logistic"].predict(ids[1]))):
            logits = torch.logit(torch.as_tensor(np.clip(p, 1e-12, 1 - 1e-12)))
            rows[name][f"ne_{task}"] = normalized_entropy(logits, y)
            rows[name][f"auc_{task}"] = roc_auc(logits, y) if name != "train base rate" else 0.5
        rows["candidate rate"][f"alpha_{task}"] = fitted["item_rate"].alpha
        rows["logistic u+i"][f"lambda_{task}"] = fitted["logistic"].lam
    return list(rows.values())


def band_rows(runs: list[dict], k: float = K_SE) -> list[dict]:
    """Per variant: mean, sd and (vs `fast`) the difference, tolerance and verdict of each metric."""
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    out = {v: {"variant": v, "seeds": sum(r["variant"] == v for r in runs)} for v in variants}
    for m in METRICS:
        values = {v: [r[m] for r in runs if r["variant"] == v] for v in variants}
        rows = seed_band_rows(values, "fast", k) if "fast" in values and len(values["fast"]) >= 2 else [
            {"label": v, "mean": float(np.mean(x)), "sd": float(np.std(x, ddof=1)) if len(x) > 1 else None,
             "difference": None, "tolerance": None, "within": None} for v, x in values.items()]
        for row in rows:
            out[row["label"]].update({m: row["mean"], f"{m}_sd": row["sd"], f"{m}_diff": row["difference"],
                                      f"{m}_tol": row["tolerance"], f"{m}_within": row["within"]})
    return list(out.values())


def quality(preset: Preset, variants: tuple[str, ...], seeds: int, steps: int, *, device: str = "cpu",
            log=print) -> dict:
    """Every run, the banded rows and the baselines (the module doc's bench, as data)."""
    _, _, manifest = described_manifest(preset.data.folder)
    section = manifest["dataset"]
    log("fitting the id-only baselines on the train split ...")
    baselines = baseline_rows(preset, section)
    runs = []
    for seed in range(seeds):
        for variant in variants:
            log(f"seed {seed}: {variant} ({steps} steps) ...")
            runs.append(train_and_evaluate(preset, variant, seed, steps, device))
    labels = {t: section["labels"][t]["name"] for t in TASKS}
    return {"bench": "quality", "preset": preset.name, "data": asdict(preset.data), "labels": labels,
            "steps": steps, "seeds": seeds, "batch_size": preset.train.batch_size, "k_se": K_SE,
            "window": max(1, preset.model.max_len // WINDOW_FRACTION), "runs": runs, "bands": band_rows(runs),
            "baselines": baselines, "device": device, "measured_on": provenance(device, 1)}


def table_rows(result: dict) -> list[dict]:
    """One row per variant and baseline: each metric's mean (+- sd over seeds), and its
    difference from the fast fp32 runs with the band's verdict."""
    rows = []
    for r in result["bands"] + result["baselines"]:
        row = {"model": r["variant"], "seeds": r.get("seeds") or "-"}
        for m in METRICS:
            sd = r.get(f"{m}_sd")
            row[m] = f"{r[m]:.4f}" + (f" +- {sd:.4f}" if sd is not None else "")
        diff, within = r.get("ne_click_diff"), r.get("ne_click_within")
        row["ne_click_vs_fast"] = "" if diff is None else f"{diff:+.4f} ({'inside' if within else 'OUTSIDE'} +- {r['ne_click_tol']:.4f})"
        diff, within = r.get("auc_click_diff"), r.get("auc_click_within")
        row["auc_click_vs_fast"] = "" if diff is None else f"{diff:+.4f} ({'inside' if within else 'OUTSIDE'} +- {r['auc_click_tol']:.4f})"
        rows.append(row)
    return rows


def title(result: dict) -> str:
    d, labels = result["data"], result["labels"]
    return (f"{d['name']} eval ({d['n_eval']:,} rows): {result['preset']} preset, {result['steps']} steps x batch "
            f"{result['batch_size']}, seeds 0..{result['seeds'] - 1}; click = {labels['click']}, conversion = "
            f"{labels['conversion']}; NE over the eval base rate's entropy (lower is better); band: "
            f"{result['k_se']:g} standard errors of the difference of means vs fast fp32")


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="small", choices=list(PRESETS), help="the architecture (data from --dataset)")
    add_dataset_arg(p)
    add_device_arg(p)
    p.add_argument("--seeds", type=int_at_least(2), default=3, help="training runs per variant (>= 2: a seed band)")
    p.add_argument("--steps-per-run", type=positive_int, default=2000, help="training steps of each run")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--out", metavar="DIR", type=output_dir, help="write quality.json and quality.md here")
    p.add_argument("--json", metavar="PATH", type=output_file, help="write the record here")


def run(args: argparse.Namespace) -> int:
    if args.dataset is None:
        raise UsageError("--dataset DIR is required: the folder to measure on (e.g. from gemref data movielens)")
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or "fast" not in variants:
        raise UsageError(f"--variants {args.variants!r}: " + (f"unknown {unknown}; " if unknown else "")
                         + f"choose from {', '.join(VARIANTS)}, fast included (the reference)")
    preset = dataset_preset(args.preset, args.dataset)
    device = device_of(args.device).type
    result = quality(preset, variants, args.seeds, args.steps_per_run, device=device, log=lambda s: print(s, flush=True))
    rows = table_rows(result)
    print(format_table(rows, title=title(result)))
    if args.out:
        from pathlib import Path

        write_json(Path(args.out) / "quality.json", result)
        atomic_write_text(Path(args.out) / "quality.md", f"{title(result)}\n\n{markdown_table(rows)}\n")
    if args.json:
        write_json(args.json, result)
    return 0
