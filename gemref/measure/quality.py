"""What a technique costs in model quality: short training runs over seeds, eval NE and AUC of both tasks, against the seed-to-seed spread.

Every run is `train_and_evaluate`: gemref.measure.run.run from the preset's TrainConfig with the
steps, the seed and a variant's changes, evaluated after its last step (NE: gemref/train/metrics.py).

`quality_cost(preset, window, seeds, steps)`: the sliding window's cost. For each seed
0..N-1, two runs of the preset (jagged, cpu_jagged, same seed and batches), without and with
ModelConfig.window = `window`, evaluated on the preset's eval batches. Reported: every run, the
paired window - full differences, and (N >= 2) the full runs' seed band (max - min over
seeds), the spread a difference must exceed to mean anything. With N = 1 there is no band.

`variant_quality(preset, variants, seeds, steps)`: each rung and technique on a dataset
folder, every run evaluated on the WHOLE eval split, the variants interleaved within each seed:

    fast        rungs 1-2 (jagged, the fused attention kernel `auto` picks), fp32: the
                reference whose seed band judges the others. Rungs 3-6 (compile, AutoAC,
                load balance, FSDP) change how a step runs, not what it computes (AutoAC's
                larger batch aside), so this is the math of the best rung a CPU runs
    baseline    rung 0: eager, padded to max_len, materialised attention (the slowest by far)
    mxfp8       rung 7's MXFP8 GEMMs (emulated off Blackwell: the numerics, not the speed)
    window      windowed sequence attention, W = max_len // WINDOW_FRACTION
    compressed  every block's saved activations stored as MXFP8 (`ac_compress="mxfp8"`)

Beside them, computed on the same split: the train base rate (a constant), the candidate's
smoothed like-rate and a logistic regression on user and candidate ids (gemref/data/baselines.py;
hyper-parameters chosen on a validation part of train). NE is the mean log loss over the
entropy of the eval split's own base rate: 1 is the eval base rate, so the constant train rate
scores above 1 where the rate drifts. A variant is inside the reference's seed band when its
mean is within k standard errors of the difference of means (gemref/report/seed_band.py). The
user table is the sparse table named "user" in the manifest's dataset section, else sparse_0.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, replace

import numpy as np
import torch

from ..train.presets import Preset, get_preset
from ..train.override import override
from ..data.baselines import Ids, fit_baselines
from ..data.folder import described_manifest
from ..model.gem import TASKS
from ..precision.support import Support, precision_support
from ..train.metrics import normalized_entropy, roc_auc
from ..report.records import RunRecord, provenance
from ..report.seed_band import K_SE, seed_band_rows
from .run import run as train_run

METRICS = tuple(f"{m}_{t}" for t in TASKS for m in ("ne", "auc"))   # ne_click, auc_click, ne_conversion, ...
VARIANTS = ("fast", "baseline", "mxfp8", "window", "compressed")
WINDOW_FRACTION = 8              # the window variant: window = max_len // WINDOW_FRACTION events


def train_and_evaluate(preset: Preset, seed: int, steps: int, *, device: str = "cpu", data_root=None,
                       **changes) -> RunRecord:
    """One quiet run (no progress bar, no memory pass) of `steps` steps from `seed`, the preset's
    TrainConfig changed by `changes`; its run record, the final evaluation under "eval"."""
    return train_run(preset, override(preset.train, steps=steps, seed=seed, **changes), device=device,
                     data_root=data_root, progress=False, measure_memory=False)


def windowed(preset: Preset, window: int | None) -> Preset:
    """The preset with ModelConfig.window = `window` (None: full attention)."""
    return replace(preset, model=override(preset.model, window=window))


def quality_cost(preset: str | Preset, window: int, seeds: int, steps: int, data_root=None, log=print) -> dict:
    """Paired full/window training runs per seed (module doc)."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    runs, diffs = [], []
    for seed in range(seeds):
        log(f"training {preset.name} seed {seed}: full, then window {window} ...")
        pair = {}
        for name, w in (("full", None), ("window", window)):
            record = train_and_evaluate(windowed(preset, w), seed, steps, data_root=data_root, jagged=True,
                                        kernel="cpu_jagged")
            pair[name] = {m: float(record["eval"][m]) for m in METRICS}
        runs += [{"seed": seed, "variant": name, **m} for name, m in pair.items()]
        diffs.append({"seed": seed, **{m: pair["window"][m] - pair["full"][m] for m in METRICS}})
    summary = []
    for m in METRICS:
        full = [r[m] for r in runs if r["variant"] == "full"]
        band = max(full) - min(full) if seeds >= 2 else None
        mean_diff = statistics.mean(d[m] for d in diffs)
        summary.append({"metric": m, "full_mean": statistics.mean(full),
                        "window_mean": statistics.mean(r[m] for r in runs if r["variant"] == "window"),
                        "mean_difference": mean_diff, "full_seed_band": band,
                        "within_band": None if band is None else abs(mean_diff) <= band})
    return {"preset": preset.name, "window": window, "steps": steps, "seeds": seeds, "runs": runs,
            "differences": diffs, "summary": summary}


def variant_run(preset: Preset, variant: str) -> tuple[Preset, dict]:
    """(the preset, TrainConfig changes) of a variant (module doc)."""
    fast = {"jagged": True, "kernel": "auto"}
    if variant == "window":
        return windowed(preset, max(1, preset.model.max_len // WINDOW_FRACTION)), fast
    return preset, {"fast": fast, "baseline": {"jagged": False, "kernel": "reference"},
                    "mxfp8": {**fast, "precision": "mxfp8"}, "compressed": {**fast, "ac_compress": "mxfp8"}}[variant]


def variant_support(variant: str, device) -> Support:
    """Whether `variant` runs on `device` here: its precision's gates (gemref/precision/support.py;
    every other variant runs wherever fp32 does)."""
    return precision_support(variant_run(get_preset("tiny"), variant)[1].get("precision", "fp32"), device)


def variant_result(preset: Preset, variant: str, seed: int, steps: int, device: str = "cpu") -> dict:
    """One training run of a variant; NE/AUC of both tasks on the whole eval split, seconds."""
    p, changes = variant_run(preset, variant)
    batches = math.ceil(p.data.n_eval / p.train.batch_size)
    t0 = time.perf_counter()
    record = train_and_evaluate(p, seed, steps, device=device, eval_batches=batches, **changes)
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


def variant_quality(preset: Preset, variants: tuple[str, ...], seeds: int, steps: int, *, device: str = "cpu",
                    log=print) -> dict:
    """Every run, the banded rows and the baselines (module doc), as the record `gemref bench quality` writes."""
    _, _, manifest = described_manifest(preset.data.folder)
    section = manifest["dataset"]
    log("fitting the id-only baselines on the train split ...")
    baselines = baseline_rows(preset, section)
    runs = []
    for seed in range(seeds):
        for variant in variants:
            log(f"seed {seed}: {variant} ({steps} steps) ...")
            runs.append(variant_result(preset, variant, seed, steps, device))
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
        for m in ("ne_click", "auc_click"):
            diff, within = r.get(f"{m}_diff"), r.get(f"{m}_within")
            row[f"{m}_vs_fast"] = "" if diff is None else \
                f"{diff:+.4f} ({'inside' if within else 'OUTSIDE'} +- {r[f'{m}_tol']:.4f})"
        rows.append(row)
    return rows


def title(result: dict) -> str:
    """The table's title: the data, the runs and how NE and the band are defined."""
    d, labels = result["data"], result["labels"]
    return (f"{d['name']} eval ({d['n_eval']:,} rows): {result['preset']} preset, {result['steps']} steps x batch "
            f"{result['batch_size']}, seeds 0..{result['seeds'] - 1}; click = {labels['click']}, conversion = "
            f"{labels['conversion']}; NE over the eval base rate's entropy (lower is better); band: "
            f"{result['k_se']:g} standard errors of the difference of means vs fast fp32")
