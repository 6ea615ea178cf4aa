"""The waterfall's rows and tables from what the ranks measured (gemref/waterfall/runner.py).

One row per rung: "ran" rows carry the figures of stats.py (E2E MFU = local MFU x scaling
ratio, paired vs_previous with its spread, windows kept, the step-time breakdown), the
others their reason. `table_rows`/`breakdown_rows` and `notes` are what `gemref waterfall`
and notebook 10 print.
"""
from __future__ import annotations

from ..train.config import switch_values
from ..train.record import train_from_record
from ..report import fmt
from .schedule import CONTENDED_BELOW, Round, Window
from .stats import breakdown, chain, kept_windows, median_window, paired_ratio

FIGURES = ("tokens_per_s", "samples_per_s", "model_tflops_per_s", "executed_tflops_per_s", "mfu", "local_mfu",
           "scaling_ratio", "hfu")
TABLE_COLUMNS = ("rung", "windows", "tokens_per_s", "spread", "local_mfu", "scaling_ratio", "e2e_mfu",
                 "mfu_basis", "peak_memory_mb", "vs_previous", "vs_baseline")
BREAKDOWN_COLUMNS = ("rung", "step_s", "gemm_s", "attention_s", "elementwise_s", "optimizer_s", "other_s",
                     "exposed_comm_s", "waiting_s", "queued_s", "data_s")


# The format each low-precision recipe names in a ran row's label (gemref/precision/config.py PRECISIONS).
FORMAT_NAMES = {"bf16": "bf16 autocast", "float8_rowwise": "float8 row-wise", "float8_tensorwise": "float8 tensor-wise",
                "mxfp8": "MXFP8"}


def row_title(rung, info: dict) -> str:
    """A ran rung's label: its ladder title, except that the low-precision rung names the format
    it ran in ("7 + bf16 autocast" on a CPU whose bf16 GEMMs win, "7 + MXFP8" on a Blackwell GPU),
    so a table never calls a bf16 run float8, and the FSDP rung names its mesh, saying so when it had
    no replicate dim ("6 + FSDP/sharded tables, 1x2 (1D: 2D needs 4+ ranks)"). info: the rank's
    resolved switches (runner.py)."""
    if rung.key == "fsdp_2d" and info.get("mesh"):
        mesh = info["mesh"]
        if mesh.startswith("1x"):
            return f"{rung.spec.number} + FSDP/sharded tables, {mesh} (1D: 2D needs 4+ ranks)"
        return f"{rung.title}, {mesh}"
    if rung.key != "low_precision":
        return rung.title
    return f"{rung.spec.number} + {FORMAT_NAMES[info['resolved']['precision']]}"


def home_group(groups: list[list[int]], j: int) -> int:
    """The group whose windows make rung j's row: the first holding j and the rung before it."""
    return next(g for g, members in enumerate(groups) if j in members and (j == 0 or j - 1 in members))


def group_rounds(result: dict, g: int) -> list[Round]:
    """Group g's rounds as Windows; a CUDA window gets its compute seconds from the profiled steps."""
    members = result["groups"][g]
    out = []
    for r in result["rounds"]:
        if r["group"] != g:
            continue
        ranks = []
        for rank, row in enumerate(r["windows"]):
            windows = [Window.from_dict(w) for w in row]
            for pos, w in enumerate(windows):
                profile = (result["profiles"][members[pos]] or [None] * len(r["windows"]))[rank]
                if w.compute() is None and profile:
                    w.compute_s = profile["compute_per_step_s"] * len(w.steps)
            ranks.append(windows)
        out.append(Round(g, r["index"], r["attempt"], ranks, r["kept"]))
    return out


def build_rows(plan: list, result: dict, peaks: list[float | None]) -> list[dict]:
    """plan: [(rung, TrainConfig or reason)]; result: the ranks' measurement; peaks: one device's
    peak FLOP/s per rung that ran, in order."""
    groups, rows, ran = result["groups"], [], []
    for rung, cfg in plan:
        if isinstance(cfg, str):
            rows.append({"rung": rung.title, "key": rung.key, "status": cfg})
            continue
        j = len(ran)
        g = home_group(groups, j)
        rounds, pos = group_rounds(result, g), groups[g].index(j)
        kept = kept_windows(rounds, pos, peaks[j])
        attempts = [rank[pos] for r in rounds for rank in r.windows]
        row = {"rung": row_title(rung, result["info"][j]), "key": rung.key, "status": "ran", "group": g,
               "windows_kept": len(kept), "windows": len({r.index for r in rounds}), "contended_windows": sum(w.contended for w in attempts),
               "batch_size": cfg.batch_size, **result["info"][j]}
        mid = median_window(kept)
        row.update({k: mid[k] if mid else None for k in FIGURES})
        row["tokens_per_s_min"] = min((f["tokens_per_s"] for f in kept.values()), default=None)
        row["tokens_per_s_max"] = max((f["tokens_per_s"] for f in kept.values()), default=None)
        row["model_flops_per_sample"] = sum(w.model_flops for w in attempts) / sum(w.samples for w in attempts)
        if mid:
            at = next(r for r in rounds if r.kept and r.index == mid["round"])
            row["breakdown"] = breakdown([rank[pos] for rank in at.windows], result["profiles"][j])
        memory = result["memory"][j]
        row["peak_memory_bytes"] = max(m["peak_memory_bytes"] for m in memory) if memory else None
        if j == 0:
            row.update(vs_previous=1.0, vs_baseline=1.0)
        else:
            prev = kept_windows(rounds, groups[g].index(j - 1), peaks[j - 1])
            ratio = paired_ratio(kept, prev)
            row.update(vs_previous=ratio["median"], vs_previous_min=ratio["min"], vs_previous_max=ratio["max"],
                       vs_previous_pairs=ratio["pairs"])
            if len(groups) == 1:
                base = paired_ratio(kept, kept_windows(rounds, 0, peaks[0]))
                row.update(vs_baseline=base["median"], vs_baseline_min=base["min"], vs_baseline_max=base["max"])
            else:
                row["vs_baseline"] = chain([ran[-1]["vs_baseline"], ratio["median"]])
        rows.append(row)
        ran.append(row)
    return rows


def _ratio(r: dict, key: str) -> str:
    if r.get(key) is None:
        return "N/A (no uncontended pair)"
    if r.get(f"{key}_min") is None:
        return f"{r[key]:.2f}x"
    return f"{r[key]:.2f}x ({r[f'{key}_min']:.2f}..{r[f'{key}_max']:.2f})"


def table_rows(rows: list[dict]) -> list[dict]:
    """The printed waterfall: windows kept, median tokens/s and spread, local MFU x scaling = E2E MFU."""
    out = []
    for r in rows:
        if r["status"] != "ran":
            out.append({"rung": r["rung"], "windows": r["status"].split(":")[0] + " (see below)"})
            continue
        spread = (f"{fmt(r['tokens_per_s_min'])}..{fmt(r['tokens_per_s_max'])}"
                  if r["tokens_per_s_min"] is not None else None)
        out.append({"rung": r["rung"], "windows": f"{r['windows_kept']}/{r['windows']}",
                    "tokens_per_s": r["tokens_per_s"], "spread": spread, "local_mfu": r["local_mfu"],
                    "scaling_ratio": r["scaling_ratio"], "e2e_mfu": r["mfu"], "mfu_basis": r.get("mfu_basis"),
                    "peak_memory_mb": r["peak_memory_bytes"] / 2**20 if r.get("peak_memory_bytes") else None,
                    "vs_previous": _ratio(r, "vs_previous"), "vs_baseline": _ratio(r, "vs_baseline")})
    return out


def breakdown_rows(rows: list[dict]) -> list[dict]:
    """Seconds per step of each rung, by where they went (stats.breakdown)."""
    return [{"rung": r["rung"], **r["breakdown"]} for r in rows if r.get("breakdown")]


def notes(record: dict) -> list[str]:
    """The footnotes of the table: n/a reasons, contention, schedule, peak, where it was measured."""
    rows, on = record["rungs"], record["measured_on"]
    out = [f"with {name}: {what}" for name, what in record.get("with", {}).items()]   # --with options
    out += [f"{r['rung']}: {r['status']}" for r in rows if r["status"] != "ran"]
    for r in rows:
        if r["status"] == "ran" and r["contended_windows"]:
            out.append(f"{r['rung']}: {r['contended_windows']} window(s) contended (a rank got < "
                       f"{CONTENDED_BELOW:.0%} of a core), {r['windows_kept']}/{r['windows']} kept"
                       + ("; NOT MEASURED: every window contended" if not r["windows_kept"] else ""))
    out.append(f"schedule: {record['schedule']}; contention measured by "
               + ("run-queue delay (schedstat)" if record["schedstat"] else "process CPU / wall time")
               + f"; {record['retries_used']} round(s) re-measured")
    ran = [r for r in rows if r["status"] == "ran"]
    for source in dict.fromkeys(r["peak_source"] for r in ran):       # one line per peak, naming its rungs
        users = [r for r in ran if r["peak_source"] == source]
        basis = users[0].get("mfu_basis") or "peak"
        out.append(f"{basis} (rungs {', '.join(str(r['rung']).split()[0] for r in users)}): {source} "
                   f"(per device; their MFUs divide by it x {record['ranks']} rank(s))")
    out.append(f"measured {on['date_utc']} UTC on {on['device']} ({on['cpu_count']} CPUs, "
               f"{on['threads_per_rank']} thread(s) per rank), torch {on['torch']}, gemref {on['gemref']} "
               f"({(on['git_sha'] or 'no git')[:10]})")
    return out


def rung_changes(rows: list[dict], version: int) -> list[dict]:
    """The ladder as code: per rung, the switches whose values differ from the rung before
    ("name: old -> new", from each row's recorded TrainConfig), beside its measured gain. A rung
    with no recorded config (not run here) says why. `version`: the waterfall record's."""
    out, before = [], None
    for r in rows:
        stored = (r.get("config") or {}).get("train")
        if stored is None:
            out.append({"rung": r["rung"], "changes": f"({r.get('status', 'not run')}: no config recorded)",
                        "vs_previous": _ratio(r, "vs_previous")})
            continue
        now = switch_values(train_from_record(stored, version))
        changed = [f"{k}: {before[k]!r} -> {v!r}" for k, v in now.items() if before is not None and before[k] != v]
        out.append({"rung": r["rung"], "changes": "; ".join(changed) if before is not None else "(the baseline)",
                    "vs_previous": _ratio(r, "vs_previous")})
        before = now
    return out
