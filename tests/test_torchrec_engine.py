"""`embeddings="torchrec"` (gemref/interop/tables.py, sharders.py): in one process the same forward and
step as native tables given the same table optimizer; combinations that cannot hold are refused
naming both options; `gemref train --ranks 2 --embeddings torchrec` trains and records the plan."""
from __future__ import annotations

import json

import pytest
import torch

from gemref.cli import main
from gemref.train.config import TrainConfig
from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.data.batches import batch_with_lengths
from gemref.errors import UsageError

from gemref.interop.lib import available

needs_torchrec = pytest.mark.skipif(not available(), reason="TorchRec is not installed (requirements-nodeps.txt)")


@pytest.mark.parametrize("changes, names", [
    ({"embeddings": "torchrec", "sparse_sharding": "row"}, ("embeddings='torchrec'", "sparse_sharding='row'")),
    ({"torchrec_sharding": "row_wise"}, ("torchrec_sharding='row_wise'", "embeddings='torchrec'")),
    ({"embeddings": "torchrec", "checkpoint_dir": "ck", "checkpoint_every": 1}, ("embeddings='torchrec'", "checkpoint_dir")),
    ({"embeddings": "tensorflow"}, ("embeddings='tensorflow'", "native, torchrec")),
    ({"embeddings": "torchrec", "torchrec_sharding": "grid_shard"},
     ("torchrec_sharding='grid_shard'", "auto, table_wise, row_wise, column_wise, table_row_wise, data_parallel")),
])
def test_impossible_combinations_are_usage_errors_naming_both(changes, names):
    with pytest.raises(UsageError) as e:
        override(TrainConfig(), **changes)
    assert all(n in str(e.value) for n in names), str(e.value)


def test_the_cli_refuses_torchrec_with_native_sharding_in_one_line(capsys):
    assert main(["train", "--preset", "tiny", "--ranks", "2", "--embeddings", "torchrec", "--sparse-sharding", "row",
                 "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "embeddings='torchrec'" in err and "sparse_sharding='row'" in err, err


@pytest.mark.parametrize("flags", [["--checkpoint-dir", "ck", "--checkpoint-every", "1"],
                                   ["--checkpoint-dir", "ck", "--resume"]])
def test_the_cli_refuses_torchrec_checkpoints_in_one_line(flags, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--preset", "tiny", "--ranks", "2", "--embeddings", "torchrec", *flags, "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not save checkpoints yet" in err and "drop checkpoint_dir" in err, err
    assert not (tmp_path / "ck").exists()      # refused before anything was written


@pytest.mark.parametrize("flag", [["--torchrec-sharding", "grid_shard"], ["--set", "torchrec_sharding=grid_shard"]])
def test_the_cli_refuses_an_unknown_torchrec_sharding_listing_the_valid_ones(flag, capsys):
    assert main(["train", "--preset", "tiny", "--embeddings", "torchrec", *flag, "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "grid_shard" in err, err
    assert all(name in err for name in ("table_row_wise", "data_parallel", "column_wise")), err


@needs_torchrec
@pytest.mark.parametrize("jagged", [False, True])
def test_one_process_torchrec_step_equals_native_with_adagrad_tables(jagged):
    from gemref.interop.tables import ADAGRAD_EPS, engine_record, uses_torchrec
    from gemref.step import train_step
    from gemref.train.compose import build_model, make_optimizer

    preset = get_preset("tiny")
    results = {}
    for engine in ("native", "torchrec"):
        train = override(preset.train, jagged=jagged, embeddings=engine)
        model, _, _ = build_model(preset, train, torch.device("cpu"))
        optimizer = make_optimizer(model, train)
        tables = None
        if engine == "native":   # the TorchRec engine's table optimizer, on the native tables
            optimizer.param_groups[1]["params"] = []
            tables = torch.optim.Adagrad(model.tables.parameters(), lr=train.lr, eps=ADAGRAD_EPS)
        else:
            assert uses_torchrec(model) and engine_record(model)["plan"]["ec.item"]["sharding"] == "unsharded"
            assert not optimizer.param_groups[1]["params"]     # TorchRec's own optimizer has the tables
        losses = []
        for step in range(3):
            batch = batch_with_lengths(preset.model, [0, 31, 2, 1, 0, 7, 3], seed=step)
            if tables is not None:
                tables.zero_grad(set_to_none=True)
            losses.append(train_step(model, optimizer, batch))
            if tables is not None:
                tables.step()
        weights = {"item": model.tables["item"].weight if engine == "native" else model.tables.ec.embeddings["item"].weight,
                   "sparse_0": model.tables["sparse_0"].weight if engine == "native"
                   else model.tables.ebc.embedding_bags["sparse_0"].weight, "heads": model.heads.weight}
        results[engine] = (torch.stack(losses), {k: w.detach().clone() for k, w in weights.items()})
    torch.testing.assert_close(results["torchrec"][0], results["native"][0], rtol=1e-6, atol=1e-6)
    for name, w in results["native"][1].items():
        torch.testing.assert_close(results["torchrec"][1][name], w, rtol=1e-5, atol=1e-6, msg=name)


@needs_torchrec
@pytest.mark.multiproc
def test_train_on_two_ranks_with_torchrec_records_the_plan(data_root, tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["train", "--preset", "tiny", "--ranks", "2", "--embeddings", "torchrec", "--steps", "3",
                 "--set", "eval_batches=1", "--set", "warmup_steps=1", "--json", str(out), "--quiet"]) == 0
    record = json.loads(out.read_text())
    engine = record["embeddings"]
    assert engine["engine"] == "torchrec" and engine["optimizer"] == "exact_adagrad"
    assert set(engine["plan"]) == {"ec.item", "ec.action", "ec.time_gap", "ec.position"} | \
        {f"ebc.sparse_{f}" for f in range(get_preset("tiny").model.n_sparse)}
    for entry in engine["plan"].values():
        assert entry["kernel"] == "fused" and set(entry["ranks"]) <= {0, 1} and entry["ranks"]
    assert all(map(lambda x: x == x and x < 10, record["loss_curve"]))
    from gemref.model.gem import GEMRef
    assert record["parameters"] == sum(p.numel() for p in GEMRef(get_preset("tiny").model).parameters())
    assert "TorchRec plan" in capsys.readouterr().out
