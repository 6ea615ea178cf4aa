"""Hardware profiles, where a mesh dim's groups sit, and the published measurements the collective
model (collectives.py) is checked against; the SMs a collective holds.

A profile has two link tiers (LinkTier, collectives.py): NVLink inside a node and one NIC per GPU
between nodes (rail-optimised). `ranks_per_node` says how a mesh dim's groups lie on the nodes
(consecutive ranks, `gpus_per_node` per node; gemref/parallel/mesh.py puts a shard group on
consecutive ranks) and `price_group` prices one collective of a group with collectives.price:
intra-node tier, inter-node tier carrying the node's share, NCCL's algorithm choices. `group_tier`
is the slower tier a group touches.

Checked against published nccl-tests-style bus bandwidths (`PUBLISHED`, `published_comparison`):
the model's bus bandwidth at large sizes is the tier's bandwidth (every profile's 0.8 x the link's
one-way figure: ASSUMED, the share nccl-tests reaches on NVLink, which the H200 figures confirm),
and the error per scale is stated in `published_comparison`. The latencies (3 us NVLink, 8-10 us a
network step) are ASSUMED orders of magnitude; NCCL's own tuner uses 3.4 and 14 us per ring step
(NVIDIA/nccl src/graph/tuning.cc, Simple protocol).

SMs a collective occupies (what its overlap costs the compute, step_model.py): NCCL runs a
collective as a GPU kernel whose thread blocks hold SMs for the whole transfer; a transport
driven from the host (NCCLX's CTran: RDMA from a CPU thread, zero-copy) keeps one. `TRANSPORTS`
gives the SMs per collective kind, `GPU_SMS` the SMs of each profile's GPU, and
`sm_share(kind, hw, transport)` = k / SM count, the share of the SMs an overlapped collective
takes from the compute.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..parallel.config import MeshShape
from .collectives import CollectiveCost, LinkTier, bus_bandwidth, price


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    gpus_per_node: int
    intra: LinkTier
    inter: LinkTier
    gpu: str = ""         # name matched against gemref/mfu/peak.py's table for compute peaks
    notes: str = ""
    sm_count: int | None = None   # streaming multiprocessors per GPU; None: GPU_SMS[gpu]


# Bandwidths: vendor per-GPU link figures (one direction) x 0.8, the share of link bandwidth
# NCCL's bus bandwidth typically reaches in nccl-tests at large messages. Latencies: order
# of magnitude of a small-message step (NVLink ~ a few us; RDMA over InfiniBand/RoCE ~ 5-10 us
# per step including software). Both are assumptions to calibrate with nccl-tests on the
# real cluster (`gemref simulate project --bandwidth-scale` varies every bandwidth).
_EFF = 0.8
HARDWARE: dict[str, HardwareProfile] = {
    "h100_ib_ndr": HardwareProfile(
        "h100_ib_ndr", 8,
        LinkTier("nvlink4", 3e-6, _EFF * 450e9,
                 "NVIDIA H100 SXM datasheet: NVLink 900 GB/s per GPU (both directions) -> 450 GB/s one way"),
        LinkTier("ib_ndr_400", 8e-6, _EFF * 50e9,
                 "NVIDIA DGX H100: one ConnectX-7 400 Gb/s (50 GB/s) NIC per GPU"),
        "H100", "8x H100 SXM per node (NVSwitch), InfiniBand NDR, rail-optimised"),
    "h200_ib_ndr": HardwareProfile(
        "h200_ib_ndr", 8,
        LinkTier("nvlink4", 3e-6, _EFF * 450e9, "NVIDIA H200 SXM datasheet: NVLink 900 GB/s per GPU"),
        LinkTier("ib_ndr_400", 8e-6, _EFF * 50e9, "400 Gb/s NIC per GPU (DGX H200 / HGX H200 reference)"),
        "H200", "8x H200 SXM per node, InfiniBand NDR"),
    "h100_roce_400": HardwareProfile(
        "h100_roce_400", 8,
        LinkTier("nvlink4", 3e-6, _EFF * 450e9, "NVIDIA H100 SXM datasheet: NVLink 900 GB/s per GPU"),
        LinkTier("roce_400", 10e-6, _EFF * 50e9,
                 "Meta, 'RDMA over Ethernet for Distributed AI Training at Meta Scale' (SIGCOMM 2024): "
                 "400 Gb/s RoCE per GPU"),
        "H100", "Meta-style RoCE training cluster: 8 GPUs per node, 400G RoCE per GPU"),
    "gb200_nvl72": HardwareProfile(
        "gb200_nvl72", 72,
        LinkTier("nvlink5", 3e-6, _EFF * 900e9,
                 "NVIDIA GB200 NVL72: NVLink 5 1.8 TB/s per GPU (both directions) -> 900 GB/s one way, 72 GPUs"),
        LinkTier("ib_xdr_800", 8e-6, _EFF * 100e9, "ConnectX-8 800 Gb/s (100 GB/s) per GPU"),
        "B200", "72 GPUs in one NVLink domain (compute peak: the B200 entry, a lower bound for GB200)"),
}


HARDWARE["b200_efa_400"] = HardwareProfile(
    "b200_efa_400", 8,
    LinkTier("nvlink5", 3e-6, _EFF * 900e9,
             "NVIDIA B200: NVLink 5 1.8 TB/s per GPU (both directions) -> 900 GB/s one way"),
    LinkTier("efa_400", 10e-6, _EFF * 50e9, "AWS P6-B200: 8 x 400 Gb/s EFA (v4) per node, one per GPU"),
    "B200", "AWS P6-B200-like: 8x B200 per node (NVSwitch), 400G EFA per GPU (the 4-node measurement in PUBLISHED)")


def get_profile(name: str) -> HardwareProfile:
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(f"unknown hardware profile {name!r}; valid: {', '.join(HARDWARE)}") from None


def group_tier(dim: str, mesh: MeshShape, hw: HardwareProfile) -> LinkTier:
    """The link tier a mesh dim's groups run on (rank r at (r // S, r % S); nodes of gpus_per_node).

    A shard group is S consecutive ranks: one node when S <= gpus_per_node and nodes hold
    whole groups. A replicate group has stride S: in one node only if R * S fits in it.
    """
    if dim == "shard":
        inside = mesh.shard <= hw.gpus_per_node and hw.gpus_per_node % mesh.shard == 0
    elif dim == "replicate":
        inside = mesh.world <= hw.gpus_per_node
    elif dim == "world":
        inside = mesh.world <= hw.gpus_per_node
    else:
        raise ValueError(f"unknown mesh dim {dim!r}; valid: shard, replicate, world")
    return hw.intra if inside else hw.inter


def ranks_per_node(dim: str, mesh: MeshShape, hw: HardwareProfile, group_size: int | None = None) -> int:
    """How many ranks of one group of mesh dim `dim` share a node (nodes of gpus_per_node consecutive ranks).

    A group inside one node (group_tier intra) has them all. A shard group is S consecutive ranks:
    gpus_per_node of them per node when S is a multiple of it. A replicate group has stride S: one
    rank per node when S >= gpus_per_node, else gpus_per_node / S. "world" is every rank. A layout
    that tiles the nodes unevenly counts one rank per node (every step on the NICs)."""
    n = group_size or {"shard": mesh.shard, "replicate": mesh.replicate, "world": mesh.world}.get(dim, 0)
    if group_tier(dim, mesh, hw) is hw.intra:
        return max(1, n)
    gpn = hw.gpus_per_node
    if dim == "shard":
        g = gpn if mesh.shard % gpn == 0 else 1
    elif dim == "replicate":
        g = 1 if mesh.shard >= gpn or gpn % mesh.shard else gpn // mesh.shard
    else:
        g = gpn
    g = min(g, n)
    return g if n % g == 0 else 1


def price_group(kind: str, payload_bytes: float, group_size: int, dim: str, mesh: MeshShape, hw: HardwareProfile,
                algorithm: str = "auto", schedule: str = "nccl") -> tuple[CollectiveCost, str]:
    """One collective of a mesh dim's group on `hw` (collectives.price) and the tier(s) it ran on."""
    g = ranks_per_node(dim, mesh, hw, group_size)
    cost = price(kind, payload_bytes, group_size, g, hw.intra, hw.inter, algorithm, schedule)
    tier = (hw.intra.name if g >= group_size else hw.inter.name if g == 1 or schedule == "flat"
            else f"{hw.intra.name}+{hw.inter.name}")
    return cost, tier


@dataclass(frozen=True)
class Published:
    """A published bus bandwidth (nccl-tests' definition) of one collective at one scale."""

    kind: str
    ranks: int
    ranks_per_node: int
    payload_bytes: float
    bus_gb_s: float
    hardware: str        # the HARDWARE profile that describes the machine measured
    source: str


_ML_ENG = ("S. Bekman, Machine Learning Engineering (github.com/stas00/ml-engineering), network/README.md: "
           "8x H200 SXM, NVLink 4, nccl 2.27.7, nccl-tests at 16 GiB")
_ML_ENG_4N = ("S. Bekman, Machine Learning Engineering, network/README.md 'Inter-node speed depends on intra-node "
              "speed': 4 x AWS P6-B200 (8x B200, 8x 400 Gb/s EFA v4 per node), all_reduce_bench.py, "
              "nccl 2.27.7, 16 GiB")
# H200 and H100 SXM share NVLink 4 (450 GB/s one way per GPU), so the H200 node checks the H100 profiles' NVLink
# tier too. The all-reduce is the ring's (NCCL_NVLS_ENABLE=0): NVLink SHARP (NVLS) reached 480.0 GB/s on the same
# node and is not modelled (the model is 25% below it).
PUBLISHED: tuple[Published, ...] = (
    Published("all_gather", 8, 8, 16 * 2**30, 361.4, "h200_ib_ndr", _ML_ENG),
    Published("reduce_scatter", 8, 8, 16 * 2**30, 362.9, "h200_ib_ndr", _ML_ENG),
    Published("all_reduce", 8, 8, 16 * 2**30, 367.2, "h200_ib_ndr", _ML_ENG + ", NCCL_NVLS_ENABLE=0 (ring)"),
    Published("all_reduce", 32, 8, 16 * 2**30, 381.8, "b200_efa_400", _ML_ENG_4N),
)


def published_comparison(published=PUBLISHED) -> list[dict]:
    """Each published bus bandwidth beside the model's on its profile, under NCCL's schedule
    (`model_gb_s`, `error` = model / published - 1) and the two-level one (`hierarchical_gb_s`,
    `hierarchical_error`; collectives.price). At 16 GiB the latency is negligible: a one-node
    collective's bus bandwidth is its tier's. 1 node (8 GPUs, NVLink 4): all-gather -0.4%,
    reduce-scatter -0.9%, all-reduce (ring) -2.0%. 4 nodes (32 GPUs): all-reduce -16.4% as NCCL's
    ring over all 32 ranks (each NIC carries 31/32 of the payload / 8), +8.1% in two levels (3/4 of
    it / 8); the measurement sits between (EFA ran at 74% of its 50 GB/s there by the two-level
    reading, the profile assumes 80%). tests/test_collectives.py holds these."""
    out = []
    for p in published:
        hw = get_profile(p.hardware)
        g = min(p.ranks_per_node, p.ranks)
        costs = {s: price(p.kind, p.payload_bytes, p.ranks, g, hw.intra, hw.inter, schedule=s)
                 for s in ("nccl", "hierarchical")}
        model = {s: bus_bandwidth(p.kind, p.payload_bytes, p.ranks, c.seconds) / 1e9 for s, c in costs.items()}
        out.append({"kind": p.kind, "ranks": p.ranks, "nodes": p.ranks // g, "hardware": p.hardware,
                    "payload_bytes": p.payload_bytes, "algorithm": costs["nccl"].algorithm,
                    "published_gb_s": p.bus_gb_s, "model_gb_s": model["nccl"], "error": model["nccl"] / p.bus_gb_s - 1,
                    "hierarchical_gb_s": model["hierarchical"],
                    "hierarchical_error": model["hierarchical"] / p.bus_gb_s - 1, "source": p.source})
    return out


# Streaming multiprocessors per GPU (the profiles' `gpu` names).
GPU_SMS: dict[str, int] = {
    "H100": 132,   # NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): H100 SXM5, 132 SMs
    "H200": 132,   # NVIDIA H200 datasheet: the H100's GH100 with HBM3e, same SM count and clocks (same FLOP/s)
    "B200": 148,   # Chips and Cheese, "Nvidia's B200: Keeping the CUDA Juggernaut Rolling" (2025): 2 dies x 74 SMs
}

# SMs one collective occupies while it runs, per transport and collective kind.
# nccl: 24, the figure Meta gives for NCCL's all-gather in GEM's training (Meta's 2026 write-up
#   of GEM's training: NCCLX's SM-free all-gather took the SMs a collective occupies from 24 to
#   1); NCCL sizes every kind by the same channel count (NCCL_MIN/MAX_NCHANNELS), so all kinds.
# ncclx_smfree: NCCLX's host-driven CTran transport (Si et al., "Collective Communication for
#   100k+ GPUs", arXiv:2510.20171): collectives that only move bytes (all-gather, all-to-all,
#   broadcast) keep 1 SM (stream ordering). ASSUMPTION: reductions (reduce-scatter,
#   all-reduce) add numbers on the GPU and keep NCCL's 24; Meta's 24 -> 1 is the all-gather's.
#   `collective_sms` (Options, `gemref bench sm_contention`) sets one k for every kind.
NCCL_COLLECTIVE_SMS = 24
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")
TRANSPORTS: dict[str, dict[str, int]] = {
    "nccl": dict.fromkeys(KINDS, NCCL_COLLECTIVE_SMS),
    "ncclx_smfree": {"all_gather": 1, "all_to_all": 1, "broadcast": 1,
                     "reduce_scatter": NCCL_COLLECTIVE_SMS, "all_reduce": NCCL_COLLECTIVE_SMS},
}


def sm_count(hw: HardwareProfile) -> int:
    """SMs per GPU of a hardware profile (its own `sm_count`, else the GPU_SMS entry of its GPU)."""
    count = hw.sm_count if hw.sm_count is not None else GPU_SMS.get(hw.gpu)
    if count is None:
        raise ValueError(f"hardware profile {hw.name!r}: no SM count for GPU {hw.gpu!r} (known: "
                         f"{', '.join(GPU_SMS)}); give HardwareProfile(sm_count=...)")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"hardware profile {hw.name!r}: sm_count must be an integer >= 1, got {count!r}")
    return count


def collective_sms(kind: str, transport: str = "nccl", override: int | None = None) -> int:
    """SMs a collective of `kind` occupies on `transport`; `override` (k for every kind) wins."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport={transport!r}; valid: {', '.join(TRANSPORTS)}")
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; valid: {', '.join(KINDS)}")
    if override is None:
        return TRANSPORTS[transport][kind]
    if isinstance(override, bool) or not isinstance(override, int) or override < 0:
        raise ValueError(f"collective_sms must be an integer >= 0, got {override!r}")
    return override


def sm_share(kind: str, hw: HardwareProfile, transport: str = "nccl", override: int | None = None) -> float:
    """k / SM count: the share of the GPU's SMs a collective of `kind` holds while it runs."""
    k, n = collective_sms(kind, transport, override), sm_count(hw)
    if k > n:
        raise ValueError(f"collective_sms={k} exceeds the {n} SMs of {hw.gpu or hw.name}")
    return k / n
