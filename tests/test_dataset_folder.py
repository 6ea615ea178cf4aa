"""Any dataset folder from the command line: the manifest's dataset section, the config derived
from it, a preset that cannot hold the data, and a folder that is only ever read.

The folders here are small generated ones (the generator writes the dataset section too);
the oracles read the manifest's JSON and the files' bytes directly, not through gemref.
"""
import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from gemref.cli import main
from gemref.train.presets import get_preset, preset_on_dataset, dataset_preset
from gemref.train.override import override
from gemref.data.batches import lengths_from_percentiles, representative_batch
from gemref.data.folder import check_section, open_dataset
from gemref.data.manifest import write_manifest
from gemref.data.shards import generate_dataset
from gemref.errors import UsageError
from gemref.train import setup

TINY = get_preset("tiny")
SMALL_DATA = override(TINY.data, n_train=512, n_eval=256, shard_rows=256)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ds") / "tiny-512"
    generate_dataset(TINY.model, SMALL_DATA, out)
    (out / ".verified.json").unlink()          # as a user's folder would be: no digest cache
    return out


def snapshot(folder: Path) -> dict:
    """Every file's size, mtime and sha256 (what must not change when gemref reads a folder)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.stat()
        out[str(path.relative_to(folder))] = (st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def copy_of(folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    dst.mkdir()
    for path in folder.iterdir():
        (dst / path.name).write_bytes(path.read_bytes())
    return dst


def one_line(capsys, code: int) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_the_model_takes_the_manifest_s_data_half_and_the_preset_s_architecture(folder):
    section = json.loads((folder / "manifest.json").read_text())["dataset"]
    small = get_preset("small")
    preset = dataset_preset("small", folder)
    m = preset.model
    assert (m.item_vocab, m.action_vocab, m.time_buckets) == (section["vocab"]["item"], section["vocab"]["action"],
                                                              section["vocab"]["time_gap"])
    assert list(m.sparse_vocab) == section["vocab"]["sparse"] and m.n_dense == section["n_dense"]
    assert m.max_len == section["max_len"] == TINY.model.max_len
    assert (m.d_model, m.n_heads, m.n_layers, m.ffn_mult, m.fm_rank) == (
        small.model.d_model, small.model.n_heads, small.model.n_layers, small.model.ffn_mult, small.model.fm_rank)
    assert preset.train == small.train and preset.data.n_train == 512 and preset.data.n_eval == 256
    assert preset.data.manifest_sha256 == hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
    assert dataset_preset("small", None) == small


def test_a_preset_that_cannot_hold_the_data_names_the_field(folder):
    data = open_dataset(folder)
    longer = replace(data, max_len=100, train_lengths=tuple(min(v, 100) for v in data.train_lengths))
    with pytest.raises(UsageError, match=r"longest history is 100 events .* tiny preset's ModelConfig.max_len=64"):
        preset_on_dataset(TINY, longer)
    windowed = replace(get_preset("small"), model=override(get_preset("small").model, window=65))
    with pytest.raises(UsageError, match=r"ModelConfig.window=65 .* longer than the dataset's longest history \(64"):
        preset_on_dataset(windowed, data)
    big_batch = replace(TINY, train=override(TINY.train, batch_size=513))
    with pytest.raises(UsageError, match=r"TrainConfig.batch_size=513 exceeds dataset .*n_train=512"):
        preset_on_dataset(big_batch, data)
    with pytest.raises(UsageError, match=r"ModelConfig.item_vocab=3 but the dataset's item_vocab is 2000"):
        replace(preset_on_dataset(TINY, data), model=override(TINY.model, item_vocab=3))


def test_the_cli_refuses_a_preset_that_cannot_hold_the_data(folder, tmp_path, capsys):
    data = open_dataset(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["dataset"]["max_len"] = 65
    bad = copy_of(folder, tmp_path)
    (bad / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "run.json"
    line = one_line(capsys, main(["train", "--dataset", str(bad), "--preset", "tiny", "--steps", "1", "--json", str(out)]))
    assert "ModelConfig.max_len=64" in line and "65 events" in line and not out.exists()
    assert data.max_len == 64


def test_train_on_a_dataset_folder_records_it_and_never_writes_into_it(folder, tmp_path, capsys):
    before = snapshot(folder)
    out = tmp_path / "run.json"
    assert main(["train", "--dataset", str(folder), "--preset", "tiny", "--steps", "2", "--quiet", "--jagged",
                 "--kernel", "auto", "--json", str(out)]) == 0
    assert snapshot(folder) == before, "gemref train wrote into the dataset folder"
    record = json.loads(out.read_text())
    data = record["config"]["data"]
    assert data["folder"] == str(folder.resolve())
    assert data["manifest_sha256"] == hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()
    assert data["click_label"].startswith("click: ") and data["conversion_label"].startswith("conversion: ")
    assert "data: synthetic" in capsys.readouterr().out
    assert main(["data", "check", str(folder)]) == 0
    assert snapshot(folder) == before, "gemref data check wrote into the dataset folder"


def test_data_check_prints_the_summary_and_writes_json(folder, tmp_path, capsys):
    out = tmp_path / "check.json"
    assert main(["data", "check", str(folder), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "train" in printed and "click_rate" in printed and "vocab use" in printed
    summary = json.loads(out.read_text())
    rows = {r["split"]: r for r in summary["splits"]}
    table = pq.read_table(sorted(folder.glob("train-*.parquet"))[0])
    first = [len(x) for x in table.column("hist_item").to_pylist()]
    assert rows["train"]["rows"] == 512 and rows["eval"]["rows"] == 256
    assert rows["train"]["len_max"] >= max(first)
    clicks = np.concatenate([pq.read_table(p).column("click").to_numpy() for p in sorted(folder.glob("eval-*"))])
    assert rows["eval"]["click_rate"] == pytest.approx(clicks.mean(), abs=1e-12)
    vocab = {r["table"]: r for r in summary["vocab"]}
    assert vocab["action"]["vocab"] == 4 and 1 <= vocab["action"]["ids_used"] <= 4


@pytest.mark.parametrize("mutate, message", [
    (lambda s: s.pop("vocab"), "dataset.vocab must be an object"),
    (lambda s: s["vocab"].update(item=0), "dataset.vocab.item must be an integer >= 1, got 0"),
    (lambda s: s["vocab"].update(sparse=[5, True]), r"dataset.vocab.sparse\[1\] must be an integer"),
    (lambda s: s.update(n_sparse=3), "n_sparse is 3 but vocab.sparse lists 4 tables"),
    (lambda s: s.update(train_lengths=[1, 2]), "train_lengths must be the 101 percentiles"),
    (lambda s: s.update(train_lengths=[0] * 100 + [65]), r"in \[0, max_len=64\]"),
    (lambda s: s["labels"].pop("conversion"), "labels must name what each label column means"),
    (lambda s: s["labels"]["click"].update(name=""), "labels.click.name must be a non-empty string"),
    (lambda s: s.update(sparse_names=["a"]), "sparse_names must be a list of 4 non-empty strings"),
    (lambda s: s.update(format=2), "dataset.format must be 1, got 2"),
    (lambda s: s.update(source=["x"]), "source must be an object of text fields"),
])
def test_a_bad_dataset_section_is_one_error_naming_the_field(folder, mutate, message):
    section = json.loads((folder / "manifest.json").read_text())["dataset"]
    mutate(section)
    with pytest.raises(UsageError, match=message):
        check_section(section, "manifest.json: dataset")


@pytest.mark.parametrize("damage, message", [
    ("no manifest", "no manifest.json"),
    ("no section", "no 'dataset' section"),
    ("bad section", "dataset.n_dense must be an integer >= 1"),
    ("no eval split", "no eval split"),
    ("a shard swapped", "sha256"),
])
def test_a_folder_with_a_wrong_or_missing_manifest_exits_2_and_writes_nothing(folder, tmp_path, capsys, damage, message):
    bad = copy_of(folder, tmp_path)
    manifest = json.loads((bad / "manifest.json").read_text())
    if damage == "no manifest":
        (bad / "manifest.json").unlink()
    elif damage == "no section":
        manifest.pop("dataset")
    elif damage == "bad section":
        manifest["dataset"]["n_dense"] = 0
    elif damage == "no eval split":
        manifest["splits"].pop("eval")
    else:                                            # same size, one byte changed: only the digest can tell
        shard = sorted(bad.glob("train-*.parquet"))[0]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    if damage not in ("no manifest", "a shard swapped"):
        (bad / "manifest.json").write_text(json.dumps(manifest))
    before, out = snapshot(bad), tmp_path / "run.json"
    line = one_line(capsys, main(["train", "--dataset", str(bad), "--steps", "1", "--json", str(out)]))
    assert message in line, line
    assert snapshot(bad) == before and not out.exists()


def test_ids_outside_the_manifest_s_vocab_exit_2_naming_the_row(folder, tmp_path, capsys):
    bad = copy_of(folder, tmp_path)
    shard = sorted(bad.glob("train-*.parquet"))[0]
    table = pq.read_table(shard)
    ad = table.column("ad_id").to_numpy().copy()
    ad[7] = 2000                                     # the item table holds ids 0..1999
    table = table.set_column(table.column_names.index("ad_id"), "ad_id", pa.array(ad, pa.int64()))
    pq.write_table(table, shard)
    manifest = json.loads((bad / "manifest.json").read_text())
    write_manifest(bad, {s: [e["file"] for e in v] for s, v in manifest["splits"].items()},
                   {"dataset": manifest["dataset"]})
    line = one_line(capsys, main(["train", "--dataset", str(bad), "--steps", "1"]))
    assert "ad_id at row 7 is 2000, outside the table's vocab [0, 2000)" in line, line


def test_a_manifest_changed_after_the_run_opened_it_is_refused(folder, tmp_path):
    copy = copy_of(folder, tmp_path)
    preset = dataset_preset("tiny", copy)
    (copy / "manifest.json").write_text((copy / "manifest.json").read_text() + "\n")
    with pytest.raises(UsageError, match="changed since the run opened it"):
        setup(preset, device="cpu")


def test_length_percentiles_that_do_not_describe_the_shards_are_refused(folder, tmp_path):
    copy = copy_of(folder, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["dataset"]["train_lengths"] = sorted(min(64, v + 1) for v in manifest["dataset"]["train_lengths"])
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match=r"dataset.train_lengths\[\d+\] is \d+, the train shards' percentile"):
        setup(dataset_preset("tiny", copy), device="cpu")


def test_dataset_options_refuse_a_missing_folder(tmp_path, capsys):
    for args in (["train"], ["waterfall"], ["bench", "quality"], ["bench", "autoac"], ["bench", "window"]):
        code = main(args + ["--dataset", str(tmp_path / "nope")])
        err = capsys.readouterr().err
        assert code == 2 and "no such dataset folder" in err and len(err.strip().splitlines()) == 1, (args, err)


def test_precision_s_dataset_is_the_data_of_its_preset_runs(folder, capsys):
    line = one_line(capsys, main(["bench", "precision", "--dataset", str(folder)]))
    assert "add --preset NAME" in line


def test_lengths_drawn_from_percentiles_follow_them():
    """Inverse-CDF draws: the share of draws at or below percentile q's length is about q% (a
    binomial band of 5 standard deviations; the curve has ties, so the share may exceed q there)."""
    curve = [0] * 10 + list(range(1, 81)) + [100, 150, 200, 250, 300, 400, 500, 600, 700, 736, 736]
    draws = lengths_from_percentiles(curve, 40_000, np.random.default_rng(0))
    assert draws.min() >= 0 and draws.max() <= 736
    for q in (10, 25, 50, 75, 90, 95, 99):
        share = float((draws <= curve[q]).mean())
        band = 5 * np.sqrt(q / 100 * (1 - q / 100) / draws.size) + 0.01   # + the rounding to whole events
        assert share >= q / 100 - band, (q, share)
        assert (draws < curve[q]).mean() <= q / 100 + band, (q, share)


def test_the_autoac_profile_batch_of_a_dataset_draws_its_lengths(folder):
    preset = dataset_preset("tiny", folder)
    lengths = np.diff(representative_batch(preset.model, preset.data, 4096, seed=3).offsets.numpy())
    assert lengths.max() <= preset.model.max_len
    median = preset.data.train_lengths[50]
    assert abs(float(np.median(lengths)) - median) <= 2, (np.median(lengths), median)


def test_the_data_layer_reads_only_a_models_data_half():
    """data/ takes a DataShape (it never imports the model): a ModelConfig and a DataSizes with
    the same vocab sizes, feature counts and max_len give the same batch."""
    from gemref.data.batches import batch_with_lengths
    from gemref.data.movielens.convert import DataSizes

    model = get_preset("tiny").model
    sizes = DataSizes(item_vocab=model.item_vocab, action_vocab=model.action_vocab, time_buckets=model.time_buckets,
                      sparse_vocab=model.sparse_vocab, n_dense=model.n_dense, max_len=model.max_len)
    a, b = batch_with_lengths(model, [3, 0, 5], seed=2), batch_with_lengths(sizes, [3, 0, 5], seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors()))
    assert sizes.n_sparse == model.n_sparse


@pytest.mark.parametrize("change, message", [
    ({"item_vocab": 0}, "DataSizes.item_vocab must be >= 1, got 0"),
    ({"sparse_vocab": ()}, "DataSizes.sparse_vocab needs >= 1 table of vocab >= 1, got ()"),
    ({"sparse_vocab": (4, 0)}, r"DataSizes.sparse_vocab needs >= 1 table of vocab >= 1, got \(4, 0\)"),
    ({"max_len": 2.5}, "max_len"),
])
def test_data_sizes_refuse_what_no_table_or_history_can_hold(change, message):
    from gemref.data.movielens.convert import DataSizes

    good = dict(item_vocab=10, action_vocab=2, time_buckets=4, sparse_vocab=(3,), n_dense=1, max_len=8)
    with pytest.raises(UsageError, match=message):
        DataSizes(**(good | change))
