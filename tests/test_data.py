import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gemref.config import get_preset
from gemref.data.loader import EventDataset, make_loader, read_shard
from gemref.data.schema import samples_to_table
from gemref.data.shards import ensure_dataset, generate_dataset, shard_paths
from gemref.data.synthetic import Teacher, draw_lengths, zipf_ids

TINY = get_preset("tiny")
SMALL_DATA = dataclasses.replace(TINY.data, n_train=600, n_eval=200, shard_rows=256)


def test_same_seed_same_bytes(tmp_path):
    a = generate_dataset(TINY.model, SMALL_DATA, tmp_path / "a")
    b = generate_dataset(TINY.model, SMALL_DATA, tmp_path / "b")
    assert [s["sha256"] for s in a["splits"]["train"]] == [s["sha256"] for s in b["splits"]["train"]]
    c = generate_dataset(TINY.model, dataclasses.replace(SMALL_DATA, seed=1), tmp_path / "c")
    assert a["splits"]["train"][0]["sha256"] != c["splits"]["train"][0]["sha256"]
    assert len(a["splits"]["train"]) == 3 and [s["rows"] for s in a["splits"]["train"]] == [256, 256, 88]


def test_ensure_dataset_reuses_matching_folder(tmp_path):
    first = ensure_dataset(TINY.model, SMALL_DATA, tmp_path)
    stamp = (tmp_path / "train-00000.parquet").stat().st_mtime_ns
    assert ensure_dataset(TINY.model, SMALL_DATA, tmp_path) == first
    assert (tmp_path / "train-00000.parquet").stat().st_mtime_ns == stamp
    changed = ensure_dataset(TINY.model, dataclasses.replace(SMALL_DATA, seed=5), tmp_path)
    assert changed["data"]["seed"] == 5


def test_skewed_lengths_have_a_heavy_tail():
    lengths = draw_lengths("skewed", 20_000, 256, 20, 1.1, seed=0)
    assert lengths.min() >= 1 and lengths.max() == 256
    assert 17 <= np.median(lengths) <= 23
    assert lengths.mean() > 1.4 * np.median(lengths)          # right-skewed
    assert (lengths == 256).mean() > 0.005                    # truncation spike at max_len
    fixed = draw_lengths("fixed", 10, 256, 20)
    assert (fixed == 20).all()


def test_zipf_ids_in_range_and_skewed():
    ids = zipf_ids(np.random.default_rng(0), 50_000, 1000, 1.2)
    assert ids.min() >= 0 and ids.max() < 1000
    counts = np.bincount(ids, minlength=1000)
    assert counts[0] == counts.max() and counts[0] > 20 * counts[500]


def test_labels_depend_on_history_and_cross():
    """The teacher's click logit carries history and history x feature signal."""
    teacher = Teacher.create(TINY.model, TINY.data)
    s = teacher.sample(TINY.model, TINY.data, np.random.default_rng(3), 4000)
    assert s["click_logit"].std() > 1.0
    rate = teacher.draw(TINY.model, TINY.data, "train", 0, 4000)["click"].mean()
    assert abs(rate - TINY.data.pos_rate) < 0.03


def test_loader_batches_match_the_shard(tmp_path):
    ensure_dataset(TINY.model, SMALL_DATA, tmp_path)
    path = shard_paths(tmp_path, "train")[0]
    table = pq.read_table(path)
    ds = EventDataset([path], TINY.model)
    batch = ds.__getitems__([5, 2])
    for pos, row in enumerate([5, 2]):
        hist = batch.values[batch.offsets[pos]:batch.offsets[pos + 1]]
        assert hist[:, 0].tolist() == table.column("hist_item")[row].as_py()
        assert hist[:, 1].tolist() == table.column("hist_action")[row].as_py()
        assert batch.ad_ids[pos] == table.column("ad_id")[row].as_py()
        assert batch.labels[pos, 0] == table.column("click")[row].as_py()
    batch.validate_for(TINY.model)


def test_loader_workers_give_the_same_batches(tmp_path):
    ensure_dataset(TINY.model, SMALL_DATA, tmp_path)
    ds = EventDataset(shard_paths(tmp_path, "train"), TINY.model)
    plain = [b.values.sum().item() for b in make_loader(ds, 64, seed=3)]
    workers = [b.values.sum().item() for b in make_loader(ds, 64, seed=3, num_workers=2)]
    assert plain == workers and len(plain) == 600 // 64


def _write(tmp_path, mutate):
    teacher = Teacher.create(TINY.model, SMALL_DATA)
    s = teacher.draw(TINY.model, SMALL_DATA, "train", 0, 8)
    mutate(s)
    path = tmp_path / "bad.parquet"
    pq.write_table(samples_to_table(s, TINY.model.n_sparse), path)
    return path


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s["items"].__setitem__(3, TINY.model.item_vocab), r"hist_item at row \d+ is 2000, outside"),
    (lambda s: s["sparse"].__setitem__((4, 2), -3), r"sparse_2 at row 4 is -3"),
    (lambda s: s["dense"].__setitem__((6, 1), np.inf), r"dense\[1\] at row 6 is inf"),
    (lambda s: s["click"].__setitem__(2, 3), r"click at row 2 is 3, not 0 or 1"),
    (lambda s: s["ad_ids"].__setitem__(7, -1), r"ad_id at row 7 is -1"),
])
def test_bad_shard_values_name_file_field_row(tmp_path, mutate, message):
    path = _write(tmp_path, mutate)
    with pytest.raises(ValueError, match=message) as info:
        read_shard(path, TINY.model)
    assert "bad.parquet" in str(info.value)


def test_history_columns_must_agree(tmp_path):
    teacher = Teacher.create(TINY.model, SMALL_DATA)
    s = teacher.draw(TINY.model, SMALL_DATA, "train", 0, 4)
    table = samples_to_table(s, TINY.model.n_sparse)
    short = table.column("hist_action").to_pylist()
    short[2] = short[2][:-1] if short[2] else [0, 0]
    table = table.set_column(1, "hist_action", pa.array(short, pa.list_(pa.int16())))
    pq.write_table(table, tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="hist_action at row 2 has"):
        read_shard(tmp_path / "x.parquet", TINY.model)


def test_empty_truncated_and_foreign_files(tmp_path):
    teacher = Teacher.create(TINY.model, SMALL_DATA)
    s = teacher.draw(TINY.model, SMALL_DATA, "train", 0, 8)
    table = samples_to_table(s, TINY.model.n_sparse)
    pq.write_table(table.slice(0, 0), tmp_path / "empty.parquet")
    with pytest.raises(ValueError, match="empty.parquet: empty shard"):
        read_shard(tmp_path / "empty.parquet", TINY.model)
    pq.write_table(table, tmp_path / "full.parquet")
    data = (tmp_path / "full.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.parquet: cannot read as Parquet"):
        read_shard(tmp_path / "cut.parquet", TINY.model)
    pq.write_table(table.drop_columns(["ad_id"]), tmp_path / "nocol.parquet")
    with pytest.raises(ValueError, match="missing column 'ad_id'"):
        read_shard(tmp_path / "nocol.parquet", TINY.model)


def test_history_longer_than_max_len_is_rejected(tmp_path):
    model = dataclasses.replace(TINY.model, max_len=4)
    path = _write(tmp_path, lambda s: None)
    with pytest.raises(ValueError, match=r"history at row \d+ has \d+ events > max_len=4"):
        read_shard(path, model)


def test_manifest_lists_every_shard(tmp_path):
    m = generate_dataset(TINY.model, SMALL_DATA, tmp_path)
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk["splits"] == m["splits"]
    assert sum(s["rows"] for s in m["splits"]["eval"]) == 200
