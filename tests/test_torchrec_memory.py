"""The per-rank memory table (gemref/parallel/memory.py `rank_bytes`) counts TorchRec's tables as
each rank holds them (gemref/interop/sharders.py `table_rank_bytes`), checked against hand
arithmetic from the model's config: row_wise on 2 ranks holds ceil(rows/2) rows of every table
on rank 0 and floor(rows/2) on rank 1, x dim x 4 bytes, and as much Adagrad state (fbgemm's
exact Adagrad keeps one fp32 sum per weight); table_wise holds each table whole on the one rank
the plan names; data_parallel holds every table, its gradient and its state sum on every rank;
one process holds them all, placement "unsharded"."""
from __future__ import annotations

import pytest
import torch

from gemref.interop.lib import available
from gemref.parallel.launch import spawn

needs_torchrec = pytest.mark.skipif(not available(), reason="TorchRec is not installed (requirements-nodeps.txt)")

ODD = {"item_vocab": 2001, "sparse_vocab": (51, 201, 1001, 101)}   # odd rows: the two row shards differ
SHARDINGS = ("row_wise", "table_wise", "data_parallel")


def _preset():
    from gemref.train.presets import get_preset
    from gemref.train.override import override

    preset = get_preset("tiny")
    return override(preset, model=override(preset.model, **ODD))


def _rows(cfg) -> dict[str, int]:
    """{plan name: rows} of every table, from the config (GEMRef's table list written out)."""
    rows = {"ec.item": cfg.item_vocab, "ec.action": cfg.action_vocab, "ec.time_gap": cfg.time_buckets,
            "ec.position": cfg.max_len}
    rows.update({f"ebc.sparse_{f}": v for f, v in enumerate(cfg.sparse_vocab)})
    return rows


def _rank(rank, world):
    from gemref.train.override import override
    from gemref.data.batches import batch_with_lengths
    from gemref.parallel.memory import rank_bytes
    from gemref.parallel.parallelize import parallel_state
    from gemref.step import train_step
    from gemref.train.compose import build_model, make_optimizer

    preset = _preset()
    out = {}
    for sharding in SHARDINGS:
        train = override(preset.train, mesh="2x1", embeddings="torchrec", torchrec_sharding=sharding)
        parallel, device = parallel_state(train.parallelism, torch.device("cpu"))
        model, _, _ = build_model(preset, train, device, parallel)
        optimizer = make_optimizer(model, train)
        batch = batch_with_lengths(preset.model, [3, 0, 5], seed=rank)
        train_step(model, optimizer, batch, normalizer=6, finish_backward=parallel.finish_backward)
        out[sharding] = {"bytes": rank_bytes(model, optimizer), "plan": model.torchrec_engine["plan"]}
    return out


@needs_torchrec
@pytest.mark.multiproc
def test_rank_bytes_count_each_ranks_torchrec_shards():
    results = spawn(_rank, 2, timeout_s=400)
    cfg = _preset().model
    rows, row_bytes = _rows(cfg), cfg.d_model * 4          # fp32: 4 bytes per element
    whole = sum(rows.values()) * row_bytes
    for sharding in SHARDINGS:
        for rank, result in enumerate(results):
            got = result[sharding]["bytes"]
            tables = [p for p in got["parts"] if p["part"] == "tables"]
            assert [p["placement"] for p in tables] == [sharding], (sharding, tables)
            t = tables[0]
            if sharding == "row_wise":
                held = sum((n + 1) // 2 if rank == 0 else n // 2 for n in rows.values()) * row_bytes
                expected = {"params": held, "grads": 0, "optimizer": held}
            elif sharding == "table_wise":
                owned = [name for name, e in result[sharding]["plan"].items() if e["ranks"] == [rank]]
                held = sum(rows[name] for name in owned) * row_bytes
                expected = {"params": held, "grads": 0, "optimizer": held}
            else:   # every rank: the tables, their summed gradients (DDP's buckets), the Adagrad sums
                expected = {"params": whole, "grads": whole, "optimizer": whole}
            assert {k: t[k] for k in expected} == expected, (sharding, rank, t)
            assert t["unsharded_params"] == whole, (sharding, rank, t)
            dense = [p for p in got["parts"] if p["part"] == "dense"]
            assert got["params"] == t["params"] + sum(p["params"] for p in dense)
        if sharding == "table_wise":   # every table on exactly one rank: the ranks' bytes add up to the whole
            assert sum(_tables(r[sharding])["params"] for r in results) == whole
    held0 = sum((n + 1) // 2 for n in rows.values()) * row_bytes
    assert held0 > whole / 2, "the config's odd rows make rank 0's row shards the larger"


def _tables(result) -> dict:
    return next(p for p in result["bytes"]["parts"] if p["part"] == "tables")


@needs_torchrec
def test_one_process_torchrec_tables_are_counted_whole_with_their_adagrad_sums():
    from gemref.train.override import override
    from gemref.data.batches import batch_with_lengths
    from gemref.parallel.memory import rank_bytes
    from gemref.step import train_step
    from gemref.train.compose import build_model, make_optimizer

    preset = _preset()
    train = override(preset.train, embeddings="torchrec")
    model, _, _ = build_model(preset, train, torch.device("cpu"))
    optimizer = make_optimizer(model, train)
    train_step(model, optimizer, batch_with_lengths(preset.model, [3, 0, 5], seed=0))
    whole = sum(_rows(preset.model).values()) * preset.model.d_model * 4
    t = _tables({"bytes": rank_bytes(model, optimizer)})
    assert (t["placement"], t["params"], t["optimizer"], t["grads"], t["unsharded_params"]) == \
        ("unsharded", whole, whole, 0, whole)
