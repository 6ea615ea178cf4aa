import dataclasses
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from gemref.train.presets import get_preset
from gemref.data.loader import EventDataset, make_loader, read_shard
from gemref.data.schema import samples_to_table
from gemref.data.manifest import write_manifest
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


def _batch_fields(batch) -> tuple:
    return (*(getattr(batch, f).tolist() for f in ("values", "offsets", "sparse_ids", "dense", "ad_ids", "labels")),
            batch.host_max_length, batch.validated_for)


@pytest.mark.parametrize("order", [dict(seed=3), dict(shuffle=False, drop_last=False)])
def test_loader_workers_give_the_same_batches(tmp_path, order):
    """Worker processes building batches ahead (the CUDA default) yield exactly the batches of
    the in-line loader, in the same order: every tensor, the host-read longest history, the
    contract the batch was validated for."""
    ensure_dataset(TINY.model, SMALL_DATA, tmp_path)
    ds = EventDataset(shard_paths(tmp_path, "train"), TINY.model)
    plain = [_batch_fields(b) for b in make_loader(ds, 64, num_workers=0, **order)]
    workers = [_batch_fields(b) for b in make_loader(ds, 64, num_workers=2, **order)]
    assert plain == workers and len(plain) == (600 // 64 if "seed" in order else -(-600 // 64))
    assert plain[0][-1] is not None and plain[0][-2] > 0


def test_the_loader_builds_batches_ahead_on_cuda_and_in_line_on_cpu(tmp_path, monkeypatch):
    """The device decides the default (a faked CUDA device: the loader is built, not iterated):
    2 pinned workers with 2 batches each ahead on CUDA, none on CPU, fewer where the host's
    cores per local rank are few; a number the caller gives wins; each default stays within
    what `--num-workers` accepts (options.check_workers)."""
    from gemref.data.config import default_workers
    from gemref.options import check_workers

    ensure_dataset(TINY.model, SMALL_DATA, tmp_path)
    ds = EventDataset(shard_paths(tmp_path, "train"), TINY.model)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)

    def settings(loader):
        return loader.num_workers, loader.prefetch_factor, loader.pin_memory, loader.persistent_workers

    assert settings(make_loader(ds, 64, device="cuda")) == (2, 2, True, True)
    assert settings(make_loader(ds, 64, device=torch.device("cuda", 0))) == (2, 2, True, True)
    assert settings(make_loader(ds, 64)) == settings(make_loader(ds, 64, device="cpu")) == (0, None, False, False)
    assert settings(make_loader(ds, 64, device="cuda", num_workers=0)) == (0, None, True, False)
    assert settings(make_loader(ds, 64, device="cpu", num_workers=1)) == (1, 2, False, True)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")          # torchrun, 8 ranks on 16 cores: 1 worker each
    assert make_loader(ds, 64, device="cuda").num_workers == 1
    assert [default_workers("cuda", cores) for cores in (1, 8, 16, 24, 64)] == [0, 0, 1, 2, 2]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "x")         # not torchrun's: one rank
    assert [default_workers("cuda", cores) for cores in (1, 2, 3, 64)] == [0, 1, 2, 2]
    assert default_workers("mps", 64) == default_workers("cpu", 64) == 0
    for cores in (1, 2, 16):
        monkeypatch.setattr(os, "cpu_count", lambda: cores)
        check_workers(default_workers("cuda"))
    with pytest.raises(ValueError, match="num_workers must be >= 0, got -1"):
        make_loader(ds, 64, num_workers=-1)


def test_a_run_leaves_the_workers_to_the_device_unless_told():
    """TrainConfig.num_workers is None by default (the loader's device default: 2 on CUDA, 0 on
    CPU); `--num-workers none|N` parses; a negative count is refused naming the field."""
    from gemref.config.values import parse_field
    from gemref.train.config import TrainConfig

    assert TrainConfig().num_workers is None
    assert parse_field(TrainConfig, "num_workers", "none") is None
    assert TrainConfig(num_workers=parse_field(TrainConfig, "num_workers", "3")).num_workers == 3
    with pytest.raises(ValueError, match="TrainConfig.num_workers must be >= 0 or None, got -1"):
        TrainConfig(num_workers=-1)


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


# ----------------------------------------------------------------------------- manifests are untrusted

def _dataset(tmp_path):
    generate_dataset(TINY.model, SMALL_DATA, tmp_path)
    return json.loads((tmp_path / "manifest.json").read_text())


def _rewrite(tmp_path, manifest):
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["splits"]["train"], r"manifest.json: must be an object \{\"splits\""),
    (lambda m: {"splits": []}, r"manifest.json: must be an object"),
    (lambda m: {"splits": {"train": []}}, r"splits.train must be a non-empty list"),
    (lambda m: m["splits"]["train"][1].pop("file") and m, r"splits.train\[1\]: no 'file'"),
    (lambda m: m["splits"]["train"][0].update(rows="256") or m, r"splits.train\[0\]: 'rows' must be int, got '256'"),
    (lambda m: m["splits"]["train"][0].update(rows=True) or m, r"'rows' must be int, got True"),
    (lambda m: m["splits"]["eval"][0].update(sha256="abc") or m, r"splits.eval\[0\]: 'sha256' must be 64"),
    (lambda m: m["splits"]["train"].__setitem__(0, "train-00000.parquet") or m, r"splits.train\[0\]: must be an object"),
    (lambda m: m["splits"]["train"][0].update(file="../other/train-00000.parquet") or m, r"without '\.\.'"),
    (lambda m: m["splits"]["train"][0].update(file="/etc/passwd") or m, r"'/etc/passwd' must be a path relative"),
    (lambda m: m["splits"]["eval"].append(dict(m["splits"]["train"][0])) or m,
     r"splits.eval\[1\]: 'train-00000.parquet' is listed twice \(also at splits.train\[0\]\)"),
])
def test_a_malformed_manifest_names_the_manifest_and_the_entry(tmp_path, edit, message):
    _rewrite(tmp_path, edit(_dataset(tmp_path)))
    with pytest.raises(ValueError, match=message) as info:
        shard_paths(tmp_path, "train")
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)


def test_a_symlink_out_of_the_dataset_folder_is_refused(tmp_path):
    m = _dataset(tmp_path / "ds")
    outside = tmp_path / "elsewhere.parquet"
    os.replace(tmp_path / "ds" / "train-00000.parquet", outside)
    (tmp_path / "ds" / "train-00000.parquet").symlink_to(outside)
    _rewrite(tmp_path / "ds", m)
    with pytest.raises(ValueError, match="resolves to .*elsewhere.parquet, outside the dataset folder"):
        shard_paths(tmp_path / "ds", "train")


def _flip_byte_keep_size_and_mtime(path):
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("damage, message", [
    (lambda d: (os.replace(d / "train-00000.parquet", d / "x"), os.replace(d / "train-00001.parquet",
                d / "train-00000.parquet"), os.replace(d / "x", d / "train-00001.parquet")),
     r"train-0000[01].parquet: (\d+ bytes, the manifest says|sha256)"),
    (lambda d: _flip_byte_keep_size_and_mtime(d / "train-00002.parquet"), r"train-00002.parquet: sha256 \w+\.\.\., the manifest"),
    (lambda d: (d / "train-00001.parquet").write_bytes((d / "train-00001.parquet").read_bytes()[:-10]),
     r"train-00001.parquet: \d+ bytes, the manifest says \d+"),
    (lambda d: (d / "train-00001.parquet").unlink(), r"splits.train\[1\]: .*train-00001.parquet is listed but cannot be read"),
])
def test_a_swapped_changed_or_missing_shard_is_refused(tmp_path, damage, message):
    _dataset(tmp_path)
    shard_paths(tmp_path, "train")           # verified once: the digests are cached now
    damage(tmp_path)
    with pytest.raises(ValueError, match=message):
        shard_paths(tmp_path, "train")


def test_rows_are_checked_against_the_file(tmp_path):
    m = _dataset(tmp_path)
    m["splits"]["train"][2]["rows"] = 90
    _rewrite(tmp_path, m)
    with pytest.raises(ValueError, match="train-00002.parquet: 88 rows, the manifest says 90"):
        shard_paths(tmp_path, "train")


def test_each_shard_is_hashed_once_until_it_changes(tmp_path, monkeypatch):
    from gemref.data import manifest as manifest_module
    calls = []
    real = manifest_module.sha256_file
    monkeypatch.setattr(manifest_module, "sha256_file", lambda p, *a: calls.append(p.name) or real(p, *a))
    _dataset(tmp_path)                   # generation records the digests it computed
    (tmp_path / ".verified.json").unlink()
    calls.clear()
    shard_paths(tmp_path, "train")
    assert sorted(calls) == ["train-00000.parquet", "train-00001.parquet", "train-00002.parquet"]
    calls.clear()
    shard_paths(tmp_path, "train")
    assert calls == []
    path = tmp_path / "train-00001.parquet"
    path.write_bytes(path.read_bytes())  # same bytes, a new write: hashed again (and still good)
    shard_paths(tmp_path, "train")
    assert calls == ["train-00001.parquet"]


def test_ensure_dataset_regenerates_a_damaged_generated_folder(tmp_path, caplog):
    first = ensure_dataset(TINY.model, SMALL_DATA, tmp_path)
    _flip_byte_keep_size_and_mtime(tmp_path / "eval-00000.parquet")
    assert ensure_dataset(TINY.model, SMALL_DATA, tmp_path) == first
    assert "regenerating" in caplog.text and "eval-00000.parquet: sha256" in caplog.text
    shard_paths(tmp_path, "eval")


def test_your_own_shards_with_write_manifest(tmp_path):
    teacher = Teacher.create(TINY.model, SMALL_DATA)
    for i in range(2):
        s = teacher.draw(TINY.model, SMALL_DATA, "train", i, 20 + i)
        pq.write_table(samples_to_table(s, TINY.model.n_sparse), tmp_path / f"logs-{i}.parquet")
    m = write_manifest(tmp_path, {"train": ["logs-0.parquet"], "eval": ["logs-1.parquet"]}, {"source": "mine"})
    assert m["source"] == "mine" and m["splits"]["eval"][0]["rows"] == 21
    assert len(EventDataset(shard_paths(tmp_path, "train"), TINY.model)) == 20


# ----------------------------------------------------------------------------- nulls at any depth

@pytest.mark.parametrize("column, row", [("hist_item", 3), ("hist_time_gap", 6), ("dense", 5)])
def test_a_null_inside_a_list_names_file_column_and_row(tmp_path, column, row):
    teacher = Teacher.create(TINY.model, SMALL_DATA)
    table = samples_to_table(teacher.draw(TINY.model, SMALL_DATA, "train", 0, 8), TINY.model.n_sparse)
    values = table.column(column).to_pylist()
    values[row] = (values[row] or [0])[:-1] + [None]
    table = table.set_column(table.column_names.index(column), column,
                             pa.array(values, table.schema.field(column).type))
    pq.write_table(table.slice(1), tmp_path / "nulls.parquet")     # a sliced table: offsets not at 0
    with pytest.raises(ValueError, match=rf"nulls.parquet: column '{column}' holds a null at row {row - 1}"):
        read_shard(tmp_path / "nulls.parquet", TINY.model)


def test_first_null_row_of_nested_lists():
    from gemref.data.schema import first_null_row
    arr = pa.array([[[1], [2, 3]], [[4]], [[5], [None]], None], pa.list_(pa.list_(pa.int64())))
    assert first_null_row(arr) == 2
    assert first_null_row(arr.slice(3)) == 0 and first_null_row(arr.slice(0, 2)) is None
    assert first_null_row(pa.array([[1], None, [2]])) == 1


def test_a_loader_leaves_the_global_rng_alone(tmp_path):
    """Checkpoints restore torch's RNG state; building and iterating a loader after a resume
    must not move it (DataLoader draws its workers' base seed from the global RNG by default)."""
    ensure_dataset(TINY.model, SMALL_DATA, tmp_path)
    ds = EventDataset(shard_paths(tmp_path, "train"), TINY.model)
    before = torch.get_rng_state()
    for loader in (make_loader(ds, 64, seed=3), make_loader(ds, 64, shuffle=False, drop_last=False)):
        next(iter(loader))
    assert torch.equal(torch.get_rng_state(), before)
