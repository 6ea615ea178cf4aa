"""Collectives priced with NCCL's algorithm choices (gemref/simulate/collectives.py, cost_model.py): each
algorithm's formula by hand, auto's crossovers, two tiers against one, all-to-all latency, the fused
all-to-alls of the step, and the published bus bandwidths the model is checked against.

Every expected value is worked out by hand on concrete numbers in the comment beside it.
"""
import pytest

from gemref.parallel.config import MeshShape
from gemref.train.presets import get_preset
from gemref.parallel.volume import lookups
from gemref.simulate.collectives import (PAT_RANK_S, CollectiveCost, LinkTier, algorithm_cost, best, bus_bandwidth,
                                         price)
from gemref.simulate.cost_model import HARDWARE, get_profile, price_group, published_comparison, ranks_per_node
from gemref.simulate.projection import Options, project
from gemref.simulate.step_model import FUSED_ALL_TO_ALLS, comm_rows, step_collectives

T = LinkTier("t", 1e-5, 1e9, "test")                 # a = 10 us, b = 1 GB/s
NVL = LinkTier("nvl", 3e-6, 3.6e11, "test")          # a = 3 us, b = 360 GB/s
NIC = LinkTier("nic", 8e-6, 4e10, "test")            # a = 8 us, b = 40 GB/s
TINY = get_preset("tiny")


def parts(cost: CollectiveCost) -> tuple[float, float, str]:
    return cost.latency_s, cost.bandwidth_s, cost.algorithm


# ----------------------------------------------------------------------------- one tier, by hand


def test_each_algorithm_by_hand():
    B = 8e6                                          # bytes; n = 8 ranks: f = 7/8, L = log2 8 = 3
    # ring all-gather: 7 a = 7e-5 s; 7/8 x 8e6 / 1e9 = 7e-3 s
    assert parts(algorithm_cost("all_gather", "ring", B, 8, T)) == pytest.approx((7e-5, 7e-3, "ring"))
    assert parts(algorithm_cost("reduce_scatter", "ring", B, 8, T)) == pytest.approx((7e-5, 7e-3, "ring"))
    # PAT: 3 a + 8 x 2.8 us = 3e-5 + 2.24e-5 = 5.24e-5 s; 7e-3 / 0.75 = 9.3333e-3 s
    assert parts(algorithm_cost("all_gather", "pat", B, 8, T)) == pytest.approx((5.24e-5, 9.333333e-3, "pat"))
    # ring all-reduce: 14 a = 1.4e-4 s; 2 x 7/8 x 8e-3 = 1.4e-2 s
    assert parts(algorithm_cost("all_reduce", "ring", B, 8, T)) == pytest.approx((1.4e-4, 1.4e-2, "ring"))
    # double binary tree: 2 x 3 a = 6e-5 s; 2 x 8e6 / 1e9 = 1.6e-2 s
    assert parts(algorithm_cost("all_reduce", "tree", B, 8, T)) == pytest.approx((6e-5, 1.6e-2, "tree"))
    # all-to-all, every peer in flight: one a = 1e-5 s; 7/8 x 8e-3 = 7e-3 s. One peer after another: 7 a
    assert parts(algorithm_cost("all_to_all", "concurrent", B, 8, T)) == pytest.approx((1e-5, 7e-3, "concurrent"))
    assert parts(algorithm_cost("all_to_all", "pairwise", B, 8, T)) == pytest.approx((7e-5, 7e-3, "pairwise"))
    # broadcast: ring 7 a, tree 3 a; both B / b = 8e-3 s
    assert parts(algorithm_cost("broadcast", "ring", B, 8, T)) == pytest.approx((7e-5, 8e-3, "ring"))
    assert parts(algorithm_cost("broadcast", "tree", B, 8, T)) == pytest.approx((3e-5, 8e-3, "tree"))
    # 6 ranks: L = ceil(log2 6) = 3 steps; PAT 3e-5 + 6 x 2.8e-6 = 4.68e-5 s
    assert algorithm_cost("all_gather", "pat", B, 6, T).latency_s == pytest.approx(4.68e-5)
    assert PAT_RANK_S == 2.8e-6
    assert parts(algorithm_cost("all_reduce", "ring", B, 1, T)) == (0.0, 0.0, "ring")    # one rank moves nothing
    assert best("all_reduce", B, 8, T, "ring").times(3).latency_s == pytest.approx(4.2e-4)   # 3 calls


def test_auto_takes_pat_below_the_crossover_and_the_ring_above():
    # 512 ranks, one per node, on the NIC (a = 8 us, b = 4e10 B/s), f = 511/512, L = 9:
    #   ring  511 x 8e-6 = 4.088e-3 s          + f B / b
    #   PAT   9 x 8e-6 + 512 x 2.8e-6 = 1.5056e-3 s + f B / (0.75 b) = ... + f B / b + f B / (3 b)
    # PAT wins while f B / (3 b) < 4.088e-3 - 1.5056e-3 = 2.5824e-3 s:
    #   B* = 3 x 4e10 x 2.5824e-3 / (511/512) = 3.09888e8 / 0.998046875 = 3.104945e8 bytes
    crossover = 3.104945e8
    assert price("all_gather", 0.9 * crossover, 512, 1, NVL, NIC).algorithm == "pat"
    assert price("all_gather", 1.1 * crossover, 512, 1, NVL, NIC).algorithm == "ring"
    assert price("reduce_scatter", 1e3, 512, 1, NVL, NIC).algorithm == "pat"
    # inside a node NCCL does not run PAT (it needs one GPU per node): the ring, however small
    assert price("all_gather", 1e3, 8, 8, NVL, NIC).algorithm == "ring"
    # all-reduce, 8 ranks on NVLink (a = 3 us, b = 3.6e11): ring 14 a + 1.75 B/b, tree 6 a + 2 B/b;
    # the tree wins while 0.25 B / b < 8 a = 2.4e-5 s: B* = 2.4e-5 x 4 x 3.6e11 = 3.456e7 bytes
    assert price("all_reduce", 3.0e7, 8, 8, NVL, NIC).algorithm == "tree"
    assert price("all_reduce", 4.0e7, 8, 8, NVL, NIC).algorithm == "ring"


# ----------------------------------------------------------------------------- two tiers


def test_two_tiers_by_hand():
    # 32 ranks, 8 per node on 4 nodes; B = 3.2e9; NVLink a = 3 us, b = 3.6e11; NIC a = 8 us, b = 4e10
    # NCCL's schedule, all-gather: one ring over the 32 ranks, (32-4) NVLink steps + 3 network steps:
    #   28 x 3e-6 + 3 x 8e-6 = 1.08e-4 s; its 31/32 x 3.2e9 = 3.1e9 B go 7/8 over NVLink, 1/8 over each NIC:
    #   max(3.1e9 x 7/8 / 3.6e11, 3.1e9 / 8 / 4e10) = max(7.5347e-3, 9.6875e-3) = 9.6875e-3 s
    assert parts(price("all_gather", 3.2e9, 32, 8, NVL, NIC)) == pytest.approx((1.08e-4, 9.6875e-3, "ring"))
    # two levels: inter all-gather of B/8 = 4e8 over 4 ranks, ring: 3 x 8e-6 = 2.4e-5 s, 3/4 x 4e8 / 4e10 =
    #   7.5e-3 s (PAT: 2 x 8e-6 + 4 x 2.8e-6 = 2.72e-5 s, 1e-2 s: slower); intra all-gather of 3.2e9 over 8:
    #   7 x 3e-6 = 2.1e-5 s, 7/8 x 3.2e9 / 3.6e11 = 7.7778e-3 s.
    #   latency 2.4e-5 + 2.1e-5 = 4.5e-5 s; bandwidth max(7.7778e-3, 7.5e-3) = 7.7778e-3 s
    two = price("all_gather", 3.2e9, 32, 8, NVL, NIC, schedule="hierarchical")
    assert parts(two) == pytest.approx((4.5e-5, 7.777778e-3, "ring+ring"))
    # flat, every step and byte on the NIC: 31 x 8e-6 = 2.48e-4 s; 31/32 x 3.2e9 / 4e10 = 7.75e-2 s
    flat = price("all_gather", 3.2e9, 32, 8, NVL, NIC, schedule="flat")
    assert parts(flat) == pytest.approx((2.48e-4, 7.75e-2, "ring"))
    # all-reduce, NCCL: the ring twice, 2.16e-4 s + 1.9375e-2 s = 1.9591e-2 s; the tree: chains in the node
    #   (reduce-scatter and all-gather, 2.1e-5 s and 7.7778e-3 s each) and a tree of 4e8 B over 4 nodes:
    #   2 x 2 x 8e-6 = 3.2e-5 s, 2 x 4e8 / 4e10 = 2e-2 s: 7.4e-5 s + max(1.5556e-2, 2e-2) = 2.0074e-2 s: the ring
    assert parts(price("all_reduce", 3.2e9, 32, 8, NVL, NIC)) == pytest.approx((2.16e-4, 1.9375e-2, "ring"))
    assert parts(price("all_reduce", 3.2e9, 32, 8, NVL, NIC, "tree")) == pytest.approx((7.4e-5, 2e-2, "tree"))
    # all-reduce in two levels: the inter all-reduce of 4e8 over 4 by ring: 6 x 8e-6 = 4.8e-5 s,
    #   2 x 3/4 x 4e8 / 4e10 = 1.5e-2 s; latency 2.1e-5 + 2.1e-5 + 4.8e-5 = 9e-5 s; bandwidth max(1.5556e-2, 1.5e-2)
    two = price("all_reduce", 3.2e9, 32, 8, NVL, NIC, schedule="hierarchical")
    assert parts(two) == pytest.approx((9e-5, 1.555556e-2, "ring+ring"))
    # all-to-all, every peer in flight: the slower tier's alpha, 8e-6 s; max(7/32 x 3.2e9 / 3.6e11,
    #   3/4 x 3.2e9 / 4e10) = max(1.9444e-3, 6e-2) = 6e-2 s: bound by the share that leaves the node
    assert parts(price("all_to_all", 3.2e9, 32, 8, NVL, NIC)) == pytest.approx((8e-6, 6e-2, "concurrent"))
    # one rank per node: the NIC alone, e.g. a ring all-reduce of 1e6 B over 4: 6 x 8e-6, 1.5 x 1e6 / 4e10
    assert parts(price("all_reduce", 1e6, 4, 1, NVL, NIC, "ring")) == pytest.approx((4.8e-5, 3.75e-5, "ring"))


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast"])
def test_two_tiers_never_cost_more_than_the_flat_ring_on_the_nic(kind):
    for n in (16, 64, 512, 4096):
        for payload in (1e3, 1e6, 1e8, 1e10):
            flat = price(kind, payload, n, 8, NVL, NIC, schedule="flat")
            for schedule in ("nccl", "hierarchical"):
                two = price(kind, payload, n, 8, NVL, NIC, schedule=schedule)
                assert two.seconds <= flat.seconds * (1 + 1e-12), (kind, n, payload, schedule, two, flat)
                assert two.bandwidth_s <= flat.bandwidth_s * (1 + 1e-12)
            # two explicit levels never lose to NCCL's ring over every rank
            assert price(kind, payload, n, 8, NVL, NIC, schedule="hierarchical").seconds <= \
                price(kind, payload, n, 8, NVL, NIC).seconds * (1 + 1e-12)


def test_all_to_all_latency_does_not_grow_with_the_group():
    # peers in flight: the NIC's one alpha (8e-6 s) at 16 or 4096 ranks; one peer after another (what
    # the model charged before): (n-1) x 8e-6, 1.2e-4 s at 16 ranks and 3.276e-2 s at 4096
    assert [price("all_to_all", 1e6, n, 8, NVL, NIC).latency_s for n in (16, 128, 4096)] == pytest.approx([8e-6] * 3)
    assert price("all_to_all", 1e6, 4096, 8, NVL, NIC, "pairwise").latency_s == pytest.approx(4095 * 8e-6)


def test_where_groups_sit_on_the_nodes():
    hw = get_profile("h100_ib_ndr")                  # 8 GPUs per node
    assert ranks_per_node("shard", MeshShape(512, 8), hw) == 8          # a node per shard group
    assert ranks_per_node("replicate", MeshShape(512, 8), hw) == 1      # stride 8: one rank per node
    assert ranks_per_node("shard", MeshShape(1, 4096), hw) == 8         # FSDP over all GPUs: 8 per node, 512 nodes
    assert ranks_per_node("replicate", MeshShape(4096, 1), hw) == 8     # replicated: the world, 8 per node
    assert ranks_per_node("replicate", MeshShape(16, 4), hw) == 2       # stride 4: 2 of the group per node
    cost, tier = price_group("all_reduce", 1e6, 512, "replicate", MeshShape(512, 8), hw)
    assert tier == "ib_ndr_400" and cost.algorithm in ("ring", "tree")
    assert price_group("all_gather", 1e6, 4096, "shard", MeshShape(1, 4096), hw)[1] == "nvlink4+ib_ndr_400"


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(ValueError, match="does not apply to all_reduce"):
        price("all_reduce", 1e6, 8, 8, NVL, NIC, "pat")
    with pytest.raises(ValueError, match="algorithm='mesh'"):
        best("all_gather", 1e6, 8, NVL, "mesh")
    with pytest.raises(ValueError, match="cannot hold 3 per node"):
        price("all_gather", 1e6, 8, 3, NVL, NIC)
    with pytest.raises(ValueError, match="schedule='star'"):
        price("all_gather", 1e6, 16, 8, NVL, NIC, schedule="star")
    with pytest.raises(ValueError, match="unknown collective kind"):
        bus_bandwidth("gossip", 1e6, 8, 1.0)


# ----------------------------------------------------------------------------- the step's collectives


def test_the_step_fuses_every_tables_all_to_alls_into_one_per_direction():
    args = (TINY.model, MeshShape(1, 4), 16, 200, True, 4, "row")
    per_table = next(r for r in step_collectives(*args, fuse_all_to_alls=False) if r["kind"] == "all_to_all")
    fused = next(r for r in step_collectives(*args) if r["kind"] == "all_to_all")
    # gemref's own tables fuse every lookup too (parallel/sparse.py): counts, ids, rows and gradients, once each
    assert per_table["count"] == 4 and len(lookups(TINY.model, 16, 200, True)) > 1
    # TorchRec: input dist (ids), output dist (rows) and its backward (gradients): one each, the same bytes
    assert fused["count"] == FUSED_ALL_TO_ALLS == 3 and fused["bytes"] == per_table["bytes"]


def test_priced_rows_and_projection_carry_latency_and_bandwidth_apart():
    hw = get_profile("h100_ib_ndr")
    rows = comm_rows(step_collectives(TINY.model, MeshShape(4, 8), 16, 200, True, 2, "row"), MeshShape(4, 8), hw)
    for r in rows:
        assert r["seconds"] == pytest.approx(r["latency_s"] + r["bandwidth_s"], rel=1e-12) and r["algorithm"]
    for row in project(TINY, [64], options=Options(batches=1, batch_per_gpu=16)):
        assert row["comm_s"] == pytest.approx(row["comm_latency_s"] + row["comm_bandwidth_s"], rel=1e-12)


# ----------------------------------------------------------------------------- published measurements


def test_bus_bandwidth_at_large_sizes_is_the_tiers():
    for hw in HARDWARE.values():
        # 1e13 B over one node's GPUs: the latency (microseconds) vanishes beside seconds of bytes
        g = hw.gpus_per_node
        cost = price("all_gather", 1e13, g, g, hw.intra, hw.inter)
        bus = bus_bandwidth("all_gather", 1e13, g, cost.seconds)
        assert bus == pytest.approx(hw.intra.bandwidth_bytes_per_s, rel=1e-4)
        cost = price("all_reduce", 1e13, 64, 1, hw.intra, hw.inter, "ring")     # one rank per node: the NIC
        bus = bus_bandwidth("all_reduce", 1e13, 64, cost.seconds)
        assert bus == pytest.approx(hw.inter.bandwidth_bytes_per_s, rel=1e-4)


def test_published_bus_bandwidths_against_the_model():
    rows = {(r["kind"], r["ranks"]): r for r in published_comparison()}
    # one 8x H200 node (NVLink 4, the H100's): model 0.8 x 450 = 360 GB/s less a little latency at 16 GiB
    #   (7 x 3 us against 7/8 x 17.18e9 / 360e9 = 41.76 ms: x 1/1.0005 -> 359.8 GB/s)
    #   all-gather 359.8 / 361.4 - 1 = -0.44%; reduce-scatter / 362.9: -0.85%; ring all-reduce / 367.2: -2.01%
    assert rows[("all_gather", 8)]["error"] == pytest.approx(-0.0044, abs=3e-4)
    assert rows[("reduce_scatter", 8)]["error"] == pytest.approx(-0.0085, abs=3e-4)
    assert rows[("all_reduce", 8)]["error"] == pytest.approx(-0.0201, abs=3e-4)
    # 4 nodes x 8 B200 (NVLink 5: 720e9 B/s, EFA: 40e9 B/s per GPU), P = 16 GiB:
    #   NCCL's ring over 32 ranks: max(2 x 31/32 x 7/8 P / 720e9, 2 x 31/32 P / 8 / 40e9) = P x 6.0547e-12 s/B;
    #   bus bandwidth 2 x 31/32 / 6.0547e-12 = 320.0 GB/s before latency, 319.3 with it: -16.4% of 381.8
    #   two levels: max(2 x 7/8 P / 720e9, 2 x 3/4 x P/8 / 40e9) = P x 4.6875e-12 s/B;
    #   2 x 31/32 / 4.6875e-12 = 413.3 GB/s before latency, 412.8 with it: +8.1%
    four = rows[("all_reduce", 32)]
    assert four["nodes"] == 4 and four["algorithm"] == "ring"
    assert four["model_gb_s"] == pytest.approx(319.3, abs=0.3) and four["error"] == pytest.approx(-0.164, abs=1e-3)
    assert four["hierarchical_gb_s"] == pytest.approx(412.8, abs=0.3)
    assert four["hierarchical_error"] == pytest.approx(0.081, abs=1e-3)
    assert all(r["source"] for r in rows.values())


def test_the_projection_takes_a_schedule(capsys):
    from gemref.cli import main

    rows = {s: project(TINY, [64], options=Options(batches=1, batch_per_gpu=16, schedule=s))
            for s in ("nccl", "hierarchical", "flat")}
    for i, row in enumerate(rows["nccl"]):
        # the replicated rungs all-reduce over 64 ranks on 8 nodes: flat >= nccl >= two levels
        assert rows["flat"][i]["comm_s"] >= row["comm_s"] * (1 - 1e-12) >= rows["hierarchical"][i]["comm_s"] * (1 - 1e-12)
    with pytest.raises(ValueError, match="schedule='ring'"):
        project(TINY, [8], options=Options(batches=1, schedule="ring"))
    assert main(["simulate", "project", "--preset", "tiny", "--gpus", "16", "--batches", "1", "--schedule", "flat"]) == 0
    out = capsys.readouterr().out
    assert "latency_s" in out and "bandwidth_s" in out and "comm_latency_s" in out
