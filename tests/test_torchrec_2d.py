"""`torchrec_2d` (gemref/interop/sharders.py): TorchRec's 2D sparse parallel, DMPCollection, on gemref's
mesh RxS. DMPCollection asserts CUDA and this machine has none, so what a CPU allows is checked:
the refusals (config, CLI, library; one line, exit 2), the group arguments and which ranks form a
sharding group vs a replica group (hand-written lists, and gemref's own mesh coordinates), that the
arguments bind to torchrec 1.8.0's DMPCollection signature, and that the plan it would pass is
made for the sharding group's S ranks and, remapped by DMPCollection's own code for each global
rank, stays inside that rank's sharding group. Building DMPCollection, its forward and sync() are
NOT run here."""
from __future__ import annotations

import copy
import inspect
from types import SimpleNamespace

import pytest
import torch

from gemref.cli import main
from gemref.parallel.config import MeshShape
from gemref.train.config import TrainConfig
from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.errors import UsageError
from gemref.interop.lib import available

needs_torchrec = pytest.mark.skipif(not available(), reason="TorchRec is not installed (requirements-nodeps.txt)")


@pytest.mark.parametrize("changes, names", [
    ({"torchrec_2d": True, "mesh": "2x2"}, ("torchrec_2d", "embeddings='torchrec'")),
    ({"torchrec_2d": True, "embeddings": "torchrec", "mesh": "1x4"}, ("R >= 2 and S >= 2", "mesh=1x4")),
    ({"torchrec_2d": True, "embeddings": "torchrec", "mesh": "4x1"}, ("R >= 2 and S >= 2", "mesh=4x1")),
    ({"torchrec_2d": True, "embeddings": "torchrec", "mesh": "2x2", "torchrec_sharding": "data_parallel"},
     ("torchrec_2d", "data_parallel")),
])
def test_configs_2d_cannot_run_are_usage_errors(changes, names):
    with pytest.raises(UsageError) as e:
        override(TrainConfig(), **changes)
    assert all(n in str(e.value) for n in names) and "\n" not in str(e.value), str(e.value)


def test_a_2d_config_on_a_mesh_with_replicas_and_shards_is_accepted():
    assert override(TrainConfig(), embeddings="torchrec", mesh="2x2", torchrec_2d=True,
                    torchrec_sharding="row_wise").embedding_tables.torchrec_2d


def test_the_cli_refuses_2d_on_cpu_in_one_line_before_any_rank_starts(capsys):
    assert main(["train", "--preset", "tiny", "--device", "cpu", "--ranks", "4", "--mesh", "2x2",
                 "--embeddings", "torchrec", "--torchrec-2d", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "DMPCollection" in err and "needs CUDA" in err and "on cpu" in err, err


@needs_torchrec
def test_the_library_refuses_2d_on_cpu_in_one_line():
    from gemref.interop.sharders import use_torchrec_tables
    from gemref.model.gem import GEMRef

    model = GEMRef(get_preset("tiny").model)
    with pytest.raises(UsageError, match="DMPCollection .* needs CUDA") as e:
        use_torchrec_tables(model, lr=0.01, two_d_shard=2)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("world, shard, sharding, replica", [
    (4, 2, [[0, 1], [2, 3]], [[0, 2], [1, 3]]),
    (8, 4, [[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (6, 3, [[0, 1, 2], [3, 4, 5]], [[0, 3], [1, 4], [2, 5]]),
    (8, 2, [[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 2, 4, 6], [1, 3, 5, 7]]),
])
def test_groups_are_the_rows_and_columns_of_gemrefs_mesh(world, shard, sharding, replica):
    from gemref.interop.sharders import dmp_collection_groups, dmp_collection_kwargs

    assert dmp_collection_groups(world, shard) == (sharding, replica)
    assert dmp_collection_kwargs(world, shard) == {"world_size": world, "sharding_group_size": shard,
                                                   "use_inter_host_allreduce": True}
    mesh = MeshShape(world // shard, shard)   # gemref's FSDP mesh: (replicate index, shard index) of a rank
    for rank in range(world):
        r, s = mesh.coordinates(rank)
        assert next(g for g in sharding if rank in g) == [q for q in range(world) if mesh.coordinates(q)[0] == r]
        assert next(g for g in replica if rank in g) == [q for q in range(world) if mesh.coordinates(q)[1] == s]


def test_a_world_not_made_of_whole_groups_is_a_value_error():
    from gemref.interop.sharders import dmp_collection_groups

    with pytest.raises(ValueError, match="world 6 is not a multiple of the sharding group size 4"):
        dmp_collection_groups(6, 4)


@needs_torchrec
def test_the_arguments_bind_to_torchrecs_dmpcollection():
    from torchrec.distributed.model_parallel import DMPCollection

    from gemref.interop.sharders import dmp_collection_kwargs

    params = inspect.signature(DMPCollection.__init__).parameters
    assert params["use_inter_host_allreduce"].default is False    # TorchRec's default strides the groups
    inspect.signature(DMPCollection.__init__).bind(
        None, module=torch.nn.Module(), device=torch.device("cuda"), plan=None, global_pg=None, sharders=[],
        init_data_parallel=False, **dmp_collection_kwargs(8, 4))


@needs_torchrec
@pytest.mark.parametrize("sharding", ["row_wise", "table_wise", "auto"])
def test_the_plan_is_made_for_the_sharding_group_and_remaps_inside_each_ranks_group(sharding, monkeypatch):
    from torchrec.distributed import model_parallel
    from torchrec.distributed.model_parallel import DMPCollection

    from gemref.interop.sharders import dmp_collection_groups, plan_tables, sharders
    from gemref.interop.tables import TorchRecTables
    from gemref.model.gem import GEMRef

    cfg = get_preset("tiny").model
    world, shard = 4, 2
    tables = TorchRecTables(GEMRef(cfg).tables)
    plan = plan_tables(tables, sharding, 8, sharders(0.01, sharding), world=shard, device_type="cuda")
    rows = {"item": cfg.item_vocab, "action": cfg.action_vocab, "time_gap": cfg.time_buckets, "position": cfg.max_len}
    rows.update({f"sparse_{f}": v for f, v in enumerate(cfg.sparse_vocab)})
    assert {t for m in plan.plan.values() for t in m} == set(rows)
    for module in plan.plan.values():
        for table, p in module.items():
            assert set(p.ranks) <= set(range(shard)), (table, p.ranks)        # planned for S ranks, not the world
            if sharding != "auto":
                assert p.sharding_type == sharding and p.compute_kernel == "fused"
            if p.sharding_type in ("row_wise", "table_wise"):   # the shards cover the table's rows exactly
                assert sum(s.shard_sizes[0] for s in p.sharding_spec.shards) == rows[table]
    groups, _ = dmp_collection_groups(world, shard)
    # the remap names each shard's device cuda:(rank % local size), asking a process group for that size
    monkeypatch.setattr(model_parallel, "get_local_size", lambda *_: world)
    for rank in range(world):
        mine = copy.deepcopy(plan)
        DMPCollection._remap_sharding_plan(SimpleNamespace(_device=torch.device("cuda")), plan=mine, rank=rank,
                                           step=world // shard, sharding_group_size=shard,
                                           use_inter_host_allreduce=True)
        group = next(g for g in groups if rank in g)
        for module in mine.plan.values():
            for table, p in module.items():
                assert set(p.ranks) <= set(group), (rank, table, p.ranks, group)
                assert {s.placement.rank() for s in p.sharding_spec.shards} <= set(group)


@needs_torchrec
def test_sync_replicas_leaves_other_engines_alone():
    from gemref.interop.sharders import sync_replicas
    from gemref.model.gem import GEMRef

    sync_replicas(GEMRef(get_preset("tiny").model))   # native tables: nothing to sync, no collective
