"""Row-wise Adagrad and row-wise Adam on embedding tables (gemref/parallel/rowwise.py), the fused
exchange (gemref/parallel/sparse.py `exchange`, `fuse_lookups`) and the 2D replica sync, on gloo ranks.

The references are the plain algorithms on the dense gradient of a plain table: Adagrad row by row
(`_reference_step`: for each row the batch touched, state += mean(g^2), w -= lr g / (sqrt(state) + eps)),
Adam on whole tensors masked by the touched rows (`_reference_adam_step`); every other row and its
state untouched. One process (plain tables + the optimizer) and ranks (ShardedEmbedding + the
optimizer) are both compared with them. Tolerances: float64 tables where the test owns them
(1e-12); MyRec is fp32 (1e-5: its losses and gradients are O(1), a few fp32 roundings per element
times an Adagrad step of at most lr * sqrt(d) per element).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch import nn

from my_rec import MyRec, RecBatch, make_batch
from gemref.parallel.launch import spawn
from gemref.parallel.rowwise import ROW_OPTIMIZERS, RowWiseAdagrad, RowWiseAdam

LR, EPS, DIM, BETAS = 0.05, 1e-8, 3, (0.8, 0.95)
OPTIMIZERS = {"adagrad": lambda tables, interval=1: RowWiseAdagrad(tables, lr=LR, eps=EPS, sync_interval=interval),
              "adam": lambda tables, interval=1: RowWiseAdam(tables, lr=LR, betas=BETAS, eps=EPS,
                                                             sync_interval=interval)}
TABLES = {"big": 37, "tiny": 1, "mid": 5}


def _reference_step(weight: torch.Tensor, state: torch.Tensor, grad: torch.Tensor, touched) -> None:
    """In place, row by row (module doc)."""
    for i in sorted(set(int(r) for r in touched)):
        g = grad[i]
        state[i] += float((g * g).mean())
        weight[i] -= LR * g / (state[i].sqrt() + EPS)


def _reference_adam_step(weight, exp_avg, exp_avg_sq, grad, touched, step: int) -> None:
    """In place, on whole tensors: partial row-wise Adam (fbgemm PARTIAL_ROWWISE_ADAM) at global
    step `step`, where the mask of touched rows selects the new values."""
    hit = torch.zeros(weight.shape[0], dtype=torch.bool)
    hit[torch.as_tensor(list(touched), dtype=torch.long)] = True
    b1, b2 = BETAS
    m = b1 * exp_avg + (1 - b1) * grad
    v = b2 * exp_avg_sq + (1 - b2) * (grad * grad).mean(1)
    w = weight - LR * (m / (1 - b1 ** step)) / ((v / (1 - b2 ** step)).sqrt() + EPS)[:, None]
    weight.copy_(torch.where(hit[:, None], w, weight))
    exp_avg.copy_(torch.where(hit[:, None], m, exp_avg))
    exp_avg_sq.copy_(torch.where(hit, v, exp_avg_sq))


def _zero_state(kind: str, rows: int) -> dict:
    if kind == "adagrad":
        return {"sum": torch.zeros(rows, dtype=torch.float64)}
    return {"exp_avg": torch.zeros(rows, DIM, dtype=torch.float64), "exp_avg_sq": torch.zeros(rows, dtype=torch.float64)}


def _reference(kind: str, weight, state: dict, grad, touched, step: int) -> None:
    if kind == "adagrad":
        _reference_step(weight, state["sum"], grad, touched)
    else:
        _reference_adam_step(weight, state["exp_avg"], state["exp_avg_sq"], grad, touched, step)


def _bag_case(rng, rows: int, bags: int):
    sizes = rng.choice([0, 1, 1, 2, 9], size=bags)                  # skewed bag sizes, empty bags among them
    ids = np.minimum(rng.zipf(1.3, size=int(sizes.sum())) - 1, rows - 1)   # skewed ids: a few hot rows
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return torch.as_tensor(ids), torch.as_tensor(offsets), torch.as_tensor(rng.standard_normal((bags, DIM)))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(1, 40), bags=st.integers(1, 12),
       mode=st.sampled_from(["sum", "mean", "embedding"]), kind=st.sampled_from(sorted(OPTIMIZERS)))
def test_rowwise_optimizers_match_reference_on_plain_tables(seed, rows, bags, mode, kind):
    """Skewed ids (zipf: hot rows repeated within a batch, empty bags), 4 steps: weights and state
    match the reference after every step; untouched rows keep weights AND state bit for bit."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    table = nn.Embedding(rows, DIM, dtype=torch.float64) if mode == "embedding" else \
        nn.EmbeddingBag(rows, DIM, mode=mode, dtype=torch.float64)
    reference = table.weight.detach().clone()
    state = _zero_state(kind, rows)
    opt = OPTIMIZERS[kind](table)
    for step in range(1, 5):
        ids, offsets, w = _bag_case(rng, rows, bags)
        call = (ids,) if mode == "embedding" else (ids, offsets)
        before = table.weight.detach().clone()
        before_state = {k: v.clone() for k, v in opt.row_state(table).items()}
        plain = nn.Embedding.from_pretrained(reference.clone(), freeze=False) if mode == "embedding" else \
            nn.EmbeddingBag.from_pretrained(reference.clone(), freeze=False, mode=mode)
        out, expected = table(*call), plain(*call)
        assert torch.allclose(out, expected, rtol=0, atol=1e-12)        # forward: the plain table's
        weights = torch.as_tensor(rng.standard_normal(out.shape))
        (out * weights).sum().backward()
        (expected * weights).sum().backward()
        _reference(kind, reference, state, plain.weight.grad, ids.tolist(), step)
        assert table.weight.grad is None and opt.steps == step          # stepped inside backward, grad dropped
        assert float((table.weight.detach() - reference).abs().max()) < 1e-12
        assert all(float((opt.row_state(table)[k] - state[k]).abs().max()) < 1e-12 for k in state)
        untouched = torch.ones(rows, dtype=torch.bool)
        untouched[ids] = False
        assert torch.equal(table.weight.detach()[untouched], before[untouched])   # untouched rows: bit-equal
        assert all(torch.equal(v[untouched], before_state[k][untouched]) for k, v in opt.row_state(table).items())


def test_rowwise_adagrad_refuses_what_it_cannot_train():
    with pytest.raises(ValueError, match="got none"):
        RowWiseAdagrad([], lr=0.1)
    with pytest.raises(ValueError, match="is a Linear"):
        RowWiseAdagrad([nn.Linear(2, 2)], lr=0.1)
    with pytest.raises(ValueError, match="uses padding_idx"):
        RowWiseAdagrad([nn.Embedding(4, 2, padding_idx=0)], lr=0.1)
    with pytest.raises(ValueError, match="sync_interval >= 1"):
        RowWiseAdagrad([nn.Embedding(4, 2)], lr=0.1, sync_interval=0)
    with pytest.raises(ValueError, match="RowWiseAdam needs lr > 0"):
        RowWiseAdam([nn.Embedding(4, 2)], lr=0.0)
    with pytest.raises(ValueError, match=r"two betas in \[0, 1\)"):
        RowWiseAdam([nn.Embedding(4, 2)], lr=0.1, betas=(0.9, 1.0))


@pytest.mark.parametrize("kind, per_row", [("adagrad", 1), ("adam", DIM + 1)])
def test_rank_bytes_count_the_row_state(kind, per_row):
    """parallel/memory.py counts every row-wise state tensor (Adam: first moment d + second 1 per row)."""
    from gemref.parallel.memory import rank_bytes

    holder = nn.Module()
    holder.tables = _dense_tables()
    opt = OPTIMIZERS[kind](holder.tables)
    sum(t(torch.tensor([0, 0])).sum() for t in holder.tables.values()).backward()
    expected = sum(TABLES.values()) * per_row * 8                     # float64
    counted = rank_bytes(holder)
    assert counted["optimizer"] == counted["unsharded_optimizer"] == opt.state_bytes() == expected


# ----------------------------------------------------------------------------- sharded tables on ranks


def _dense_tables():
    torch.manual_seed(0)
    return nn.ModuleDict({n: nn.Embedding(r, DIM, dtype=torch.float64) for n, r in TABLES.items()})


def _rank_ids(step: int, rank: int):
    rng = np.random.default_rng(100 * step + rank)
    n = int(rng.choice([0, 1, 3, 40]))                               # skewed sizes, some ranks look up nothing
    ids = {name: torch.as_tensor(np.minimum(rng.zipf(1.3, size=n) - 1, rows - 1)) for name, rows in TABLES.items()}
    return ids, {name: torch.as_tensor(rng.standard_normal((n, DIM))) for name in TABLES}


def _local(t):
    return t.weight.detach().to_local() if hasattr(t.weight, "to_local") else t.weight.detach()


def _sharded_rank(rank, world, mesh_spec, modes, interval, kind="adagrad"):
    """Every rank steps its own ids; returns, per mode and step, each table's local rows and state."""
    from gemref.parallel.config import parse_mesh
    from gemref.parallel.mesh import build_mesh
    from gemref.parallel.sparse import shard_tables

    mesh = build_mesh(parse_mesh(mesh_spec), "cpu")
    out = {}
    for mode in modes:
        holder = nn.Module()
        holder.tables = _dense_tables()
        tables = shard_tables(holder, mesh, [f"tables.{n}" for n in TABLES], mode)
        opt = OPTIMIZERS[kind](tables, interval)
        steps = []
        for step in range(3):
            ids, w = _rank_ids(step, rank)
            sum((holder.tables[n](ids[n]) * w[n]).sum() for n in TABLES).backward()
            steps.append({n: (_local(t).clone(), {k: v.clone() for k, v in opt.row_state(t).items()})
                          if t.weight is not None else None
                          for n, t in zip(TABLES, tables.values())})
            assert all(t.weight.grad is None for t in tables.values() if t.weight is not None)   # no dense grad
        out[mode] = (steps, {n: t.plan.row_range(t.shard_index, t.shards) for n, t in zip(TABLES, tables.values())})
    return out


def _one_process(groups, kind, steps=3):
    """Plain tables stepped by the reference on the ids of each replica group's ranks; the groups'
    weights and states averaged after every step (R = 1: one group, the single-process step)."""
    tables = _dense_tables()
    weight = {n: tables[n].weight.detach().clone() for n in TABLES}
    state = {n: _zero_state(kind, r) for n, r in TABLES.items()}
    history = []
    for step in range(steps):
        new_w, new_s = {n: [] for n in TABLES}, {n: [] for n in TABLES}
        for ranks in groups:
            for n in TABLES:
                plain = nn.Embedding.from_pretrained(weight[n].clone(), freeze=False)
                touched = []
                for r in ranks:
                    ids, w = _rank_ids(step, r)
                    (plain(ids[n]) * w[n]).sum().backward()
                    touched += ids[n].tolist()
                wn, sn = weight[n].clone(), {k: v.clone() for k, v in state[n].items()}
                _reference(kind, wn, sn, plain.weight.grad, touched, step + 1)
                new_w[n].append(wn)
                new_s[n].append(sn)
        weight = {n: torch.stack(new_w[n]).mean(0) for n in TABLES}
        state = {n: {k: torch.stack([s[k] for s in new_s[n]]).mean(0) for k in new_s[n][0]} for n in TABLES}
        history.append((weight, state))
    return history


def _compare(results, groups, kind="adagrad"):
    history = _one_process(groups, kind)
    for rank, r in enumerate(results):
        for mode, (steps, ranges) in r.items():
            for step, tables in enumerate(steps):
                weight, state = history[step]
                for n, held in tables.items():
                    lo, hi = ranges[n]
                    if held is None or hi == lo:
                        continue
                    assert float((held[0] - weight[n][lo:hi]).abs().max()) < 1e-12, (rank, mode, step, n)
                    for k, value in held[1].items():
                        assert float((value - state[n][k][lo:hi]).abs().max()) < 1e-12, (rank, mode, step, n, k)


@pytest.mark.multiproc
@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_sharded_rowwise_optimizers_match_one_process_1x2_and_replica_mean_2x1(kind):
    """1x2: the owner gets every rank's row gradients: the single-process step on all ids. 2x1 at
    interval 1: each replica steps its own ids, then weights and states are averaged (DMPCollection)."""
    _compare(spawn(_sharded_rank, 2, ("1x2", ("row", "table"), 1, kind), timeout_s=120), [[0, 1]], kind)
    _compare(spawn(_sharded_rank, 2, ("2x1", ("row",), 1, kind), timeout_s=120), [[0], [1]], kind)


@pytest.mark.multiproc
def test_replicas_differ_between_syncs_and_agree_right_after_one():
    results = spawn(_sharded_rank, 2, ("2x1", ("row",), 3), timeout_s=120)
    (a, _), (b, _) = results[0]["row"], results[1]["row"]
    for step in range(3):
        same = all(torch.equal(a[step][n][0], b[step][n][0]) and torch.equal(a[step][n][1]["sum"], b[step][n][1]["sum"])
                   for n in TABLES)
        assert same == (step == 2), step             # synced after the 3rd step only (interval 3)


# ----------------------------------------------------------------------------- one fused exchange


def _count_rank(rank, world):
    import torch.distributed as dist

    from gemref.parallel.config import parse_mesh
    from gemref.parallel.mesh import build_mesh
    from gemref.parallel.sparse import fuse_lookups, shard_tables

    calls = []
    original = dist.all_to_all_single

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    dist.all_to_all_single = counted
    mesh = build_mesh(parse_mesh("1x2"), "cpu")
    out = {}
    for fused in (False, True):
        holder = nn.Module()
        holder.tables = _dense_tables()
        holder.forward = lambda ids: sum(holder.tables[n](i).sum() for n, i in ids.items()) + \
            holder.tables["big"](ids["mid"]).sum()                   # "big" is looked up twice
        tables = shard_tables(holder, mesh, [f"tables.{n}" for n in TABLES], "row")
        if fused:
            fuse_lookups(holder, tables, lambda ids: {f"tables.{n}": [i] for n, i in ids.items()} |
                         {"tables.big": [ids["big"], ids["mid"]]})
        RowWiseAdagrad(tables, lr=LR)
        ids, _ = _rank_ids(0, rank)
        del calls[:]
        loss = holder(ids)
        forward = len(calls)
        loss.backward()
        out[fused] = (forward, len(calls) - forward, float(loss.detach()),
                      {n: _local(t).clone() for n, t in tables.items()})
        try:
            holder.tables["big"](ids["big"])          # a lookup outside the forward whose features were fused
        except ValueError as e:
            out[f"{fused} error"] = str(e)
    dist.all_to_all_single = original
    return out


@pytest.mark.multiproc
def test_fused_exchange_is_one_all_to_all_per_direction():
    for r in spawn(_count_rank, 2, timeout_s=120):
        assert r[False][:2] == (3 * 4, 4)              # one exchange per lookup: (counts, ids, rows) x 4, grads x 4
        assert r[True][:2] == (3, 1)                   # fused: counts, ids, rows forward; rows' grads backward
        assert r[True][2] == pytest.approx(r[False][2], rel=1e-12)
        assert all(torch.allclose(r[True][3][n], r[False][3][n], rtol=0, atol=1e-12) for n in r[True][3])
        assert "fuse_lookups' features named no (more) ids" in r["True error"] and "False error" not in r


# ----------------------------------------------------------------------------- MyRec: a model from outside

LENGTHS, ITEMS = [3, 0, 5, 2, 4, 1, 6, 2], ["item", "user"]
CUT = [0, 3, 8]


def _myrec_batch(step: int) -> RecBatch:
    return make_batch(LENGTHS, seed=step)


def _part(b: RecBatch, lo: int, hi: int) -> RecBatch:
    s, e, us, ue = int(b.offsets[lo]), int(b.offsets[hi]), int(b.user_offsets[lo]), int(b.user_offsets[hi])
    return RecBatch(b.items[s:e], b.offsets[lo:hi + 1] - s, b.users[us:ue], b.user_offsets[lo:hi + 1] - us,
                    b.labels[lo:hi])


def _bce(model, b: RecBatch):
    return F.binary_cross_entropy_with_logits(model(b), b.labels, reduction="sum") / len(LENGTHS)


def _myrec(rank, world, mesh_spec):
    from gemref.parallel.config import parse_mesh
    from gemref.parallel.fsdp import apply_fsdp
    from gemref.parallel.mesh import build_mesh
    from gemref.parallel.sparse import fuse_lookups, shard_tables

    mesh = build_mesh(parse_mesh(mesh_spec), "cpu")
    torch.manual_seed(0)
    model = MyRec()
    tables = shard_tables(model, mesh, ITEMS, "row")
    fuse_lookups(model, tables, lambda b: {"item": [b.items], "user": [b.users]})
    apply_fsdp(model, mesh, ["stack.0", "stack.1"], torch.device("cpu"))
    RowWiseAdagrad(tables, lr=LR)
    dense = torch.optim.SGD([p for n, p in model.named_parameters() if n not in ("item.weight", "user.weight")],
                            lr=LR)
    for step in range(3):
        dense.zero_grad(set_to_none=True)
        _bce(model, _part(_myrec_batch(step), CUT[rank], CUT[rank + 1])).backward()
        dense.step()
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def _myrec_one_process(replica_parts):
    """MyRec in one process: dense SGD on the global batch's gradient, each table stepped by the
    reference once per replica part (its rows' gradient) from the same start, then averaged."""
    torch.manual_seed(0)
    model = MyRec()
    state = {n: torch.zeros(getattr(model, n).num_embeddings) for n in ITEMS}
    dense = torch.optim.SGD([p for n, p in model.named_parameters() if n not in ("item.weight", "user.weight")],
                            lr=LR)
    for step in range(3):
        dense.zero_grad(set_to_none=True)
        updates = {n: [] for n in ITEMS}
        start = {n: getattr(model, n).weight.detach().clone() for n in ITEMS}
        for lo, hi in replica_parts:
            for n in ITEMS:
                getattr(model, n).weight.grad = None
            b = _part(_myrec_batch(step), lo, hi)
            _bce(model, b).backward()
            for n, touched in (("item", b.items), ("user", b.users)):
                w, s = start[n].clone(), state[n].clone()
                _reference_step(w, s, getattr(model, n).weight.grad, touched)
                updates[n].append((w, s))
        dense.step()
        with torch.no_grad():
            for n in ITEMS:
                getattr(model, n).weight.copy_(torch.stack([w for w, _ in updates[n]]).mean(0))
                state[n] = torch.stack([s for _, s in updates[n]]).mean(0)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.multiproc
def test_myrec_rowwise_tables_match_one_process_at_sync_interval_1():
    """1x2 (FSDP, row-sharded tables): the single-process step on the global batch; 2x1 (replicas):
    dense from the summed gradient, tables the mean of the 2 replicas' row-wise steps."""
    for mesh_spec, parts in (("1x2", [(0, 8)]), ("2x1", [(0, 3), (3, 8)])):
        reference = _myrec_one_process(parts)
        for params in spawn(_myrec, 2, (mesh_spec,), timeout_s=180):
            for name, value in params.items():
                err = float((value - reference[name]).abs().max())
                assert err < 1e-5, (mesh_spec, name, err)


# ----------------------------------------------------------------------------- checkpoints of sharded row state


def _myrec_resume(rank, world, mesh_spec, mode, kind, interval, folder):
    """MyRec with sharded tables and a row-wise optimizer: 4 steps with a checkpoint after 2, and a
    fresh model (one step on other data first) loaded from it and stepped the last 2; returns both
    ends: every parameter, the dense Adam state and the row state, local to this rank."""
    from gemref.checkpoint import load_checkpoint, save_checkpoint
    from gemref.parallel.config import parse_mesh
    from gemref.parallel.fsdp import apply_fsdp
    from gemref.parallel.mesh import build_mesh
    from gemref.parallel.rowwise import row_state_dict
    from gemref.parallel.sparse import fuse_lookups, shard_tables

    mesh = build_mesh(parse_mesh(mesh_spec), "cpu")
    replica, shard = divmod(rank, mesh.size(1))
    lo, hi = (CUT[replica], CUT[replica + 1]) if mesh.size(0) > 1 else (0, len(LENGTHS))
    cuts = np.linspace(lo, hi, mesh.size(1) + 1).astype(int)     # this rank's part of its group's batch
    key = dict(global_batch=len(LENGTHS), seed=0)

    def build():
        torch.manual_seed(0)
        model = MyRec()
        tables = shard_tables(model, mesh, ITEMS, mode)
        fuse_lookups(model, tables, lambda b: {"item": [b.items], "user": [b.users]})
        apply_fsdp(model, mesh, ["stack.0", "stack.1"], torch.device("cpu"))
        OPTIMIZERS[kind](tables, interval)
        return model, torch.optim.Adam([p for n, p in model.named_parameters() if n not in ("item.weight", "user.weight")],
                                       lr=LR)

    def step(model, dense, s):
        dense.zero_grad(set_to_none=True)
        _bce(model, _part(_myrec_batch(s), int(cuts[shard]), int(cuts[shard + 1]))).backward()
        dense.step()

    def ends(model, dense):
        local = lambda t: (t.to_local() if hasattr(t, "to_local") else t).detach().clone()   # noqa: E731
        return ({n: local(p) for n, p in model.named_parameters()},
                {k: local(v) for k, v in row_state_dict(model).items()},
                {i: {k: local(v) for k, v in st.items()} for i, st in dense.state_dict()["state"].items()})

    model, dense = build()
    for s in range(4):
        step(model, dense, s)
        if s == 1:
            save_checkpoint(folder, 2, model, dense, **key)
    straight = ends(model, dense)
    model, dense = build()
    step(model, dense, 7)
    load_checkpoint(f"{folder}/step-00000002", model, dense, **key)
    for s in range(2, 4):
        step(model, dense, s)
    return straight, ends(model, dense)


@pytest.mark.multiproc
@pytest.mark.parametrize("mesh_spec, mode, kind, interval", [("1x2", "row", "adam", 1), ("1x2", "table", "adam", 1),
                                                             ("2x1", "row", "adagrad", 2)])
def test_sharded_row_state_resumes_bit_exact(tmp_path, mesh_spec, mode, kind, interval):
    """Row-sharded state (DTensors, 25 of 50 rows per rank), table-wise state (plain
    tensors on the owner only) and 2 replicas checkpointed on a sync step: fp32, bit for bit."""
    for rank, (straight, resumed) in enumerate(spawn(_myrec_resume, 2, (mesh_spec, mode, kind, interval,
                                                                       str(tmp_path)), timeout_s=180)):
        for a, b in zip(straight, resumed):
            assert a.keys() == b.keys() and a, rank
            for k in a:
                same = all(torch.equal(a[k][j], b[k][j]) for j in a[k]) if isinstance(a[k], dict) else \
                    torch.equal(a[k], b[k])
                assert same, (rank, k)
        assert any(v.ne(0).any() for k, v in straight[1].items() if not k.endswith(".step")), rank


# ----------------------------------------------------------------------------- the switches, GEMRef's path


def test_table_switches_are_checked():
    from gemref.train.presets import get_preset
    from gemref.train.override import override
    from gemref.errors import UsageError

    base = get_preset("tiny").train
    with pytest.raises(UsageError, match="table_sync_interval=10 is read only with table_optimizer='rowwise_adagrad'"):
        override(base, table_sync_interval=10)
    with pytest.raises(UsageError, match="table_sync_interval must be >= 1"):
        override(base, table_optimizer="rowwise_adagrad", table_sync_interval=0)
    with pytest.raises(UsageError, match="TorchRec's tables train with its own"):
        override(base, table_optimizer="rowwise_adagrad", embeddings="torchrec")
    with pytest.raises(UsageError, match="TorchRec's tables train with its own"):
        override(base, table_optimizer="rowwise_adam", embeddings="torchrec")
    with pytest.raises(UsageError, match="checkpoint_every=2 is not a multiple of table_sync_interval=3: a checkpoint "
                                         "keeps one copy of the table replicas"):
        override(base, mesh="2x1", table_optimizer="rowwise_adam", table_sync_interval=3, checkpoint_dir="x",
                 checkpoint_every=2)
    for optimizer in ("rowwise_adagrad", "rowwise_adam"):     # checkpoints save the row state (test_checkpoint.py)
        override(base, table_optimizer=optimizer, checkpoint_dir="x", checkpoint_every=1)
        override(base, mesh="2x1", table_optimizer=optimizer, table_sync_interval=2, checkpoint_dir="x",
                 checkpoint_every=4)
    with pytest.raises(UsageError, match="table_optimizer"):
        override(base, table_optimizer="adagrad")
    for bad in (0.0, -0.1):
        with pytest.raises(UsageError, match=f"table_lr must be > 0, got {bad}"):
            override(base, table_optimizer="rowwise_adagrad", table_lr=bad)
    with pytest.raises(UsageError, match="table_lr=0.5 is read only with table_optimizer='rowwise_adagrad'"):
        override(base, table_lr=0.5)


def test_the_table_lr_steps_the_rows_and_is_part_of_a_row_wise_run_identity():
    """make_optimizer hands table_lr (not lr) to the row-wise optimizer: one step on GEMRef's item
    table equals row-wise Adagrad written out by hand in float64 at that rate."""
    from gemref.train.loop import run_description
    from gemref.train.presets import get_preset
    from gemref.train.override import override
    from gemref.train.compose import build_model, make_optimizer

    preset, table_lr = get_preset("tiny"), 0.07
    train = override(preset.train, table_optimizer="rowwise_adagrad", table_lr=table_lr)
    assert table_lr != train.lr
    model, _, _ = build_model(preset, train, torch.device("cpu"))
    make_optimizer(model, train)
    table = model.tables["item"]
    before = table.weight.detach().double().numpy().copy()
    coef = np.random.default_rng(0).standard_normal(before.shape[1])
    (table(torch.tensor([3, 5, 3])) * torch.tensor(coef, dtype=table.weight.dtype)).sum().backward()
    expected = before.copy()
    for row, hits in ((3, 2), (5, 1)):              # d loss / d w_row = hits * coef
        g = hits * coef
        expected[row] -= table_lr * g / (np.sqrt(np.mean(g * g)) + 1e-8)
    np.testing.assert_allclose(table.weight.detach().double().numpy(), expected, rtol=0, atol=1e-6)
    assert run_description(preset, train)["train"]["table_lr"] == table_lr
    assert "table_lr" not in run_description(preset, preset.train)["train"]   # adamw: identity as before table_lr


@pytest.mark.parametrize("table_optimizer", ["rowwise_adagrad", "rowwise_adam"])
def test_gemref_one_process_steps_only_touched_rows_and_keeps_tables_out_of_adamw(table_optimizer):
    from gemref.train.presets import get_preset
    from gemref.train.override import override
    from gemref.data.batches import representative_batch
    from gemref.step import train_step
    from gemref.train.compose import build_model, make_optimizer

    preset = get_preset("tiny")
    train = override(preset.train, table_optimizer=table_optimizer)
    model, _, _ = build_model(preset, train, torch.device("cpu"))
    optimizer = make_optimizer(model, train)
    adamw = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in adamw for p in model.tables.parameters())
    batch = representative_batch(preset.model, preset.data, 8, torch.device("cpu"), seed=0)
    before = {n: t.weight.detach().clone() for n, t in model.tables.items()}
    train_step(model, optimizer, batch)
    item = model.tables["item"].weight.detach()
    touched = torch.zeros(item.shape[0], dtype=torch.bool)
    touched[torch.cat([batch.values[:, 0], batch.ad_ids])] = True
    assert torch.equal(item[~touched], before["item"][~touched])
    assert bool((item[touched] != before["item"][touched]).any(1).all())
    assert all(t.weight.grad is None for t in model.tables.values())
    assert all(type(t.row_optimizer) is ROW_OPTIMIZERS[table_optimizer] for t in model.tables.values())


@pytest.mark.parametrize("table_optimizer", ["adamw", "rowwise_adagrad", "rowwise_adam"])
def test_projected_optimizer_bytes_are_the_real_optimizers_state(table_optimizer):
    """projected_rank_bytes (the scale projection's memory check) from the config alone equals what
    GEMRef holds after a step on tiny (one process): the tables' optimizer state by their optimizer,
    the whole optimizer's, and the gradients (row-wise tables keep none)."""
    from gemref.parallel.config import MeshShape
    from gemref.train.presets import get_preset
    from gemref.train.override import override
    from gemref.data.batches import representative_batch
    from gemref.parallel.memory import projected_rank_bytes, rank_bytes, table_bytes
    from gemref.step import train_step
    from gemref.train.compose import build_model, make_optimizer

    preset = get_preset("tiny")
    train = override(preset.train, table_optimizer=table_optimizer)
    model, _, _ = build_model(preset, train, torch.device("cpu"))
    optimizer = make_optimizer(model, train)
    train_step(model, optimizer, representative_batch(preset.model, preset.data, 8, torch.device("cpu"), seed=0))
    projected = projected_rank_bytes(preset.model, MeshShape(1, 1), table_optimizer=table_optimizer)
    assert projected["table_optimizer"] == table_bytes(model, optimizer, "native")[1]
    held = rank_bytes(model, optimizer)
    assert projected["optimizer"] == held["optimizer"]
    assert (projected["params"], projected["grads"], projected["total"]) == \
        (held["params"], held["grads"], held["params"] + held["grads"] + held["optimizer"])
    tables = sum(p["grads"] for p in held["parts"] if p["part"] == "tables")
    assert (tables > 0) == (table_optimizer == "adamw")
