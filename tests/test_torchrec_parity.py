"""TorchRec tables against native tables on 2 gloo ranks (mesh 2x1: DDP for the dense layers).

The same initial weights, the same per-rank batches (skewed lengths, empty histories included),
the same optimizers: AdamW for the dense layers, Adagrad for the tables (fused exact Adagrad in
TorchRec's sharded kernel; torch's Adagrad on the native tables, whose gradients DDP sums). Every
step's loss, every table row and the dense weights must agree within fp32 rounding, for the
planner's plan and for each sharding type, on the padded and the jagged layout. data_parallel
tables (kernel `dense`, no fused optimizer) are trained by sharders.sum_then_adagrad's DDP comm
hook (sum, then Adagrad written out by hand); the native side's torch.optim.Adagrad is the oracle.
"""
from __future__ import annotations

import pytest
import torch

from gemref.parallel.launch import spawn

pytest.importorskip("torchrec", reason="TorchRec is not installed (requirements-nodeps.txt)")

STEPS = 3
LENGTHS = ([0, 31, 2, 1, 0, 7], [5, 0, 0, 12, 3, 1])     # rank 0's and rank 1's histories (max_len 32)
CASES = (("auto", False), ("row_wise", False), ("table_wise", True), ("column_wise", True), ("auto", True),
         ("table_row_wise", False), ("data_parallel", True))


def _run(rank, sharding, jagged, engine):
    from gemref.train.presets import get_preset
    from gemref.train.override import override
    from gemref.data.batches import batch_with_lengths
    from gemref.interop.tables import ADAGRAD_EPS, engine_parameters
    from gemref.parallel.parallelize import parallel_state
    from gemref.step import backward, forward_loss
    from gemref.train.compose import build_model

    preset = get_preset("tiny")
    train = override(preset.train, mesh="2x1", jagged=jagged, embeddings=engine,
                     torchrec_sharding=sharding if engine == "torchrec" else "auto")
    parallel, device = parallel_state(train.parallelism, torch.device("cpu"))
    model, _, _ = build_model(preset, train, device, parallel)
    engine_owned = engine_parameters(model)
    dense = [p for n, p in model.named_parameters() if not n.startswith("tables.") and id(p) not in engine_owned]
    optimizers = [torch.optim.AdamW(dense, lr=train.lr, weight_decay=train.weight_decay, fused=True)]
    if engine == "native":
        optimizers.append(torch.optim.Adagrad(model.tables.parameters(), lr=train.lr, eps=ADAGRAD_EPS))
    losses = []
    for step in range(STEPS):            # rank r's batch of step k: the same for both engines
        batch = batch_with_lengths(preset.model, LENGTHS[rank], seed=10 * step + rank)
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        loss = forward_loss(model, batch, normalizer=sum(len(x) for x in LENGTHS))
        backward(model, loss, parallel.finish_backward)
        for opt in optimizers:
            opt.step()
        losses.append(loss.detach())
    return model, torch.stack(losses), [p.detach().clone() for p in dense]


def _local_rows(model) -> dict[str, list[tuple[tuple[int, int], torch.Tensor]]]:
    """{table: [((row, col) offset, local shard)]} of this rank's TorchRec table shards (a
    data_parallel table: the whole table, a plain tensor)."""
    out = {}
    for key, value in model.tables.state_dict().items():
        table = key.split(".")[-2]
        if isinstance(value, torch.Tensor) and not hasattr(value, "local_shards"):
            out[table] = [((0, 0), value.detach())]
        else:
            out[table] = [(tuple(s.metadata.shard_offsets), s.tensor.detach()) for s in value.local_shards()]
    return out


def _initial_tables(cfg, seed: int) -> dict[str, torch.Tensor]:
    """The tables as build_model draws them (torch.manual_seed(TrainConfig.seed), then GEMRef)."""
    from gemref.model.gem import GEMRef

    torch.manual_seed(seed)
    return {n: t.weight.detach() for n, t in GEMRef(cfg).tables.items()}


def _rank(rank, world):
    from gemref.train.presets import get_preset

    out = {}
    for sharding, jagged in CASES:
        native, native_losses, native_dense = _run(rank, sharding, jagged, "native")
        trec, trec_losses, trec_dense = _run(rank, sharding, jagged, "torchrec")
        initial = _initial_tables(trec.cfg, get_preset("tiny").train.seed)
        table_err, changed = 0.0, 0
        for table, shards in _local_rows(trec).items():
            for (r, c), shard in shards:
                rows, cols = slice(r, r + shard.shape[0]), slice(c, c + shard.shape[1])
                expected = native.tables[table].weight.detach()[rows, cols]
                table_err = max(table_err, float((shard - expected).abs().max()) if shard.numel() else 0.0)
                changed += int((shard != initial[table][rows, cols]).any(1).sum())
        key = f"{sharding}/{'jagged' if jagged else 'padded'}"
        out[key] = {"loss_err": float((trec_losses - native_losses).abs().max()),
                    "table_err": table_err,
                    "dense_err": max(float((a - b).abs().max()) for a, b in zip(trec_dense, native_dense)),
                    "changed_rows": changed,
                    "plan": trec.torchrec_engine["plan"]}
    return out


@pytest.mark.multiproc
def test_torchrec_tables_train_like_native_tables():
    results = spawn(_rank, 2, timeout_s=500)
    for key in results[0]:
        for r in results:
            assert r[key]["loss_err"] < 1e-5, (key, r[key])
            assert r[key]["table_err"] < 1e-5, (key, r[key])
            assert r[key]["dense_err"] < 1e-5, (key, r[key])
        assert sum(r[key]["changed_rows"] for r in results) > 50, key   # the steps did update rows
        sharding = key.split("/")[0]
        if sharding != "auto":   # TorchRec has no table_row_wise sequence tables: those go row_wise;
            plan = results[0][key]["plan"]   # data_parallel sequence tables are plain replicas (kernel torch)
            for table, entry in plan.items():
                seq = table.startswith("ec.")
                want = "row_wise" if sharding == "table_row_wise" and seq else sharding
                kernel = ("torch" if seq else "dense") if sharding == "data_parallel" else "fused"
                assert (entry["sharding"], entry["kernel"]) == (want, kernel), (key, table, entry)
                if want in ("row_wise", "table_row_wise", "data_parallel"):   # on every rank
                    assert entry["ranks"] == [0, 1], (key, table, entry)
