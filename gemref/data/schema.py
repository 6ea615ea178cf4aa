"""The on-disk ads-event schema (Parquet) and its validation. data/README.md documents it for users.

One row per (user, candidate ad) impression:

    hist_item        list<int64>   item ids of the user's history, oldest first
    hist_action      list<int16>   action type of each history event
    hist_time_gap    list<int16>   time-gap bucket of each history event
    sparse_0..F-1    int64         one id per non-sequence categorical table
    dense            list<float32> n_dense dense features (fixed width)
    ad_id            int64         the candidate ad (an item id)
    click            int8          label, 0 or 1
    conversion       int8          label, 0 or 1

The three history lists of a row must have the same length (<= max_len). Files from outside
are untrusted: `table_to_arrays` checks every field and raises ValueError naming the file,
field and first bad row; nothing is clamped or dropped.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..errors import UsageError
from .config import DataShape

SCHEMA_VERSION = 1
HISTORY_COLUMNS = ("hist_item", "hist_action", "hist_time_gap")


def arrow_schema(n_sparse: int) -> pa.Schema:
    return pa.schema(
        [("hist_item", pa.list_(pa.int64())), ("hist_action", pa.list_(pa.int16())),
         ("hist_time_gap", pa.list_(pa.int16()))]
        + [(f"sparse_{f}", pa.int64()) for f in range(n_sparse)]
        + [("dense", pa.list_(pa.float32())), ("ad_id", pa.int64()),
           ("click", pa.int8()), ("conversion", pa.int8())])


def samples_to_table(s: dict, n_sparse: int) -> pa.Table:
    """Columnar numpy samples (values + offsets) -> an Arrow table in the schema above."""
    offsets = pa.array(s["offsets"].astype(np.int32))
    n = len(s["offsets"]) - 1
    dense = s["dense"]
    columns = [
        pa.ListArray.from_arrays(offsets, pa.array(s["items"], pa.int64())),
        pa.ListArray.from_arrays(offsets, pa.array(s["actions"].astype(np.int16))),
        pa.ListArray.from_arrays(offsets, pa.array(s["gaps"].astype(np.int16))),
        *[pa.array(s["sparse"][:, f], pa.int64()) for f in range(n_sparse)],
        pa.ListArray.from_arrays(pa.array(np.arange(0, n * dense.shape[1] + 1, dense.shape[1], dtype=np.int32)),
                                 pa.array(dense.reshape(-1), pa.float32())),
        pa.array(s["ad_ids"], pa.int64()), pa.array(s["click"], pa.int8()),
        pa.array(s["conversion"], pa.int8()),
    ]
    return pa.Table.from_arrays(columns, schema=arrow_schema(n_sparse))


@dataclass
class ShardArrays:
    """One shard in memory, columnar: history values + offsets, per-sample fields."""

    offsets: np.ndarray     # (N+1,) int64
    history: np.ndarray     # (T, 3) int64: item, action, time gap
    sparse: np.ndarray      # (N, F) int64
    dense: np.ndarray       # (N, n_dense) float32
    ad_ids: np.ndarray      # (N,) int64
    labels: np.ndarray      # (N, 2) float32


def _list_parts(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, values, null mask) of a list column, offsets rebased to 0."""
    arr = col.combine_chunks()
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
    return offsets - offsets[0], values, arr.is_null().to_numpy(zero_copy_only=False)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def first_null_row(arr: pa.Array) -> int | None:
    """The first row holding a null anywhere inside it (the row itself, or an element of a
    list at any depth), else None."""
    rows = arr.is_null().to_numpy(zero_copy_only=False)
    if isinstance(arr, (pa.ListArray, pa.LargeListArray)):
        offsets = arr.offsets.to_numpy()
        child = first_null_row(arr.values.slice(offsets[0], offsets[-1] - offsets[0]))
        if child is not None:   # the row whose [offsets[r], offsets[r+1]) range holds that element
            owner = int(np.searchsorted(offsets, offsets[0] + child, side="right")) - 1
            rows = rows.copy()
            rows[owner] = True
    return _first(rows) if rows.any() else None


def _check_range(values: np.ndarray, vocab: int, where: str, field: str, rows: np.ndarray | None = None) -> None:
    bad = (values < 0) | (values >= vocab)
    if bad.any():
        i = _first(bad)
        row = f"row {int(rows[i])}" if rows is not None else f"row {i}"
        raise UsageError(f"{where}: {field} at {row} is {int(values[i])}, outside the table's vocab [0, {vocab})")


def table_to_arrays(table: pa.Table, cfg: DataShape, where: str) -> ShardArrays:
    """Validate an Arrow table against the schema and the model's vocab sizes; return arrays."""
    if table.num_rows == 0:
        raise UsageError(f"{where}: empty shard (0 rows)")
    expected = arrow_schema(cfg.n_sparse)
    for field in expected:
        if field.name not in table.column_names:
            raise UsageError(f"{where}: missing column {field.name!r} (schema: data/README.md)")
        got = table.schema.field(field.name).type
        if not got.equals(field.type):
            raise UsageError(f"{where}: column {field.name!r} has type {got}, expected {field.type}")
        row = first_null_row(table.column(field.name).combine_chunks())
        if row is not None:
            raise UsageError(f"{where}: column {field.name!r} holds a null at row {row} (nulls are not "
                             "allowed, at any depth of a list)")

    offsets, items, _ = _list_parts(table.column("hist_item"))
    lengths = np.diff(offsets)
    hist = [items]
    for name in HISTORY_COLUMNS[1:]:
        o, v, _ = _list_parts(table.column(name))
        if not np.array_equal(o, offsets):
            row = _first(np.diff(o) != lengths)
            raise UsageError(f"{where}: {name} at row {row} has {int(np.diff(o)[row])} events, "
                             f"hist_item has {int(lengths[row])}")
        hist.append(v.astype(np.int64))
    too_long = lengths > cfg.max_len
    if too_long.any():
        row = _first(too_long)
        raise UsageError(f"{where}: history at row {row} has {int(lengths[row])} events > max_len={cfg.max_len}")
    owner = np.repeat(np.arange(len(lengths)), lengths)
    for name, values, vocab in zip(HISTORY_COLUMNS, hist, (cfg.item_vocab, cfg.action_vocab, cfg.time_buckets)):
        _check_range(values, vocab, where, name, owner)

    sparse = np.stack([table.column(f"sparse_{f}").to_numpy() for f in range(cfg.n_sparse)], axis=1)
    for f, vocab in enumerate(cfg.sparse_vocab):
        _check_range(sparse[:, f], vocab, where, f"sparse_{f}")
    d_off, d_val, _ = _list_parts(table.column("dense"))
    widths = np.diff(d_off)
    if (widths != cfg.n_dense).any():
        row = _first(widths != cfg.n_dense)
        raise UsageError(f"{where}: dense at row {row} has {int(widths[row])} values, expected {cfg.n_dense}")
    dense = d_val.astype(np.float32).reshape(-1, cfg.n_dense)
    if not np.isfinite(dense).all():
        row, col = (int(x) for x in np.argwhere(~np.isfinite(dense))[0])
        raise UsageError(f"{where}: dense[{col}] at row {row} is {dense[row, col]} (not finite)")
    ad_ids = table.column("ad_id").to_numpy()
    _check_range(ad_ids, cfg.item_vocab, where, "ad_id")
    labels = np.stack([table.column(c).to_numpy() for c in ("click", "conversion")], axis=1)
    bad = (labels != 0) & (labels != 1)
    if bad.any():
        row, col = (int(x) for x in np.argwhere(bad)[0])
        raise UsageError(f"{where}: {('click', 'conversion')[col]} at row {row} is {labels[row, col]}, not 0 or 1")
    return ShardArrays(offsets, np.stack(hist, axis=1).astype(np.int64), sparse.astype(np.int64),
                       dense, ad_ids.astype(np.int64), labels.astype(np.float32))
