"""The project's headline in the book: the reference waterfall `make demo` measured, kept in benchmarks/.

The chapters run small shapes under the `ci` profile; the number the project stands by is the
ladder `make demo` measures (`gemref waterfall --preset small --ranks 2`), kept with its date,
machine and command in benchmarks/<date>-<machine>/waterfall.json. `reference_waterfall()`
finds the newest such record; chapter 10 and the reading copy's index show it beside the run's
own, with the same table (readable column names, units) and figure.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..waterfall import TABLE_COLUMNS, table_rows

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TABLE_LABELS = {"rung": "rung", "windows": "windows kept", "tokens_per_s": "tokens/s",
                "spread": "tokens/s min..max", "local_mfu": "local MFU", "scaling_ratio": "scaling ratio",
                "e2e_mfu": "E2E MFU", "mfu_basis": "MFU divides by", "peak_memory_mb": "peak memory (MiB)", "vs_previous": "vs previous rung",
                "vs_baseline": "vs baseline"}


def command_of(record: dict) -> str:
    """The `gemref waterfall` command line that measures a record like this one."""
    parts = [f"gemref waterfall --preset {record['preset']} --ranks {record['ranks']}"]
    if record.get("device", "cpu") != "cpu":
        parts.append(f"--device {record['device']}")
    if record.get("with"):
        parts.append(f"--with {','.join(record['with'])}")
    if record.get("windows", 3) != 3 or record.get("steps_per_window", 4) != 4:
        parts.append(f"--windows {record['windows']} --steps-per-window {record['steps_per_window']}")
    return " ".join(parts)


def reference_waterfall(folder: Path | None = None) -> dict | None:
    """{"record", "folder", "measured_on", "command"} of the newest benchmarks/*/waterfall.json
    (folders are named <date>-<machine>, so the last in name order is the newest); None without one."""
    folder = folder or BENCHMARKS
    found = sorted(folder.glob("*/waterfall.json"), key=lambda p: p.parent.name)
    if not found:
        return None
    record = json.loads(found[-1].read_text())
    return {"record": record, "folder": found[-1].parent.name, "measured_on": record.get("measured_on", {}),
            "command": command_of(record)}


def with_stored_rows(rows: list[dict], ref: dict | None) -> list[dict]:
    """Every rung of the ladder: this run's row where it ran, else the reference's row of the same
    rung (labelled stored, with its date and machine); each row gains "source"."""
    stored = {r["key"]: r for r in ref["record"]["rungs"]} if ref else {}
    label = f"stored: {ref['measured_on'].get('date_utc', '?')}, {ref['measured_on'].get('device', '?')}" if ref else ""
    out = []
    for r in rows:
        if r["status"] == "ran" or r["key"] not in stored:
            out.append({**r, "source": "measured here" if r["status"] == "ran" else r["status"]})
        else:
            out.append({**stored[r["key"]], "source": label})
    return out


def percent_rows(rows: list[dict]) -> list[dict]:
    """`waterfall.table_rows` with the MFUs as percentages (the table a reader reads)."""
    out = []
    for r in table_rows(rows):
        out.append({k: (f"{100 * v:.1f}%" if k in ("local_mfu", "e2e_mfu") and isinstance(v, float) else v)
                    for k, v in r.items()})
    return out


def caption(ref: dict) -> str:
    on = ref["measured_on"]
    return (f"measured {on.get('date_utc', '?')} UTC on {on.get('device', '?')} ({on.get('cpu_count', '?')} CPUs, "
            f"{on.get('ranks', '?')} rank(s)), torch {on.get('torch', '?')}, by `{ref['command']}` "
            f"(benchmarks/{ref['folder']}/)")


COLUMNS = TABLE_COLUMNS
