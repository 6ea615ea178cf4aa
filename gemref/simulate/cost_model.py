"""Alpha-beta cost model of collectives: time = hops x latency + bytes on the wire / bandwidth.

A link tier has a latency alpha (seconds per message step) and a bandwidth beta (bytes/s,
per GPU, one direction, what a collective can use). For a group of n ranks and a payload
of B bytes (payload as in gemref/parallel/volume.py: all-gather output, reduce-scatter input, all-reduce
tensor, all-to-all input), the classic formulas (Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005; Chan et al.,
"Collective communication: theory, practice, and experience", 2007):

    all_gather, reduce_scatter (ring):   (n-1) a + (n-1)/n B/b
    all_reduce (ring):                  2(n-1) a + 2(n-1)/n B/b
    all_reduce (tree, double binary):   2 log2(n) a + 2 B/b      (NCCL's small-message choice)
    all_to_all (pairwise exchange):      (n-1) a + (n-1)/n B/b
    broadcast (pipelined tree):          log2(n) a + B/b
"auto" takes the faster all-reduce of the two, as NCCL's tuner roughly does.

Which tier a group uses: a group whose ranks all sit in one node (consecutive ranks,
`gpus_per_node` per node; gemref/parallel/mesh.py puts a shard group on consecutive ranks) uses the
intra-node tier; any group spanning nodes is bounded by the inter-node tier (one NIC per
GPU, rail-optimised: the per-GPU NIC bandwidth is the bottleneck of every ring step that
leaves the node). Hierarchical algorithms and congestion are not modelled.

`HARDWARE` profiles, `collective_time` and `group_tier` are what the step-time model
(step_model.py) prices a step's collectives with.

SMs a collective occupies (what its overlap costs the compute, step_model.py): NCCL runs a
collective as a GPU kernel whose thread blocks hold SMs for the whole transfer; a transport
driven from the host (NCCLX's CTran: RDMA from a CPU thread, zero-copy) keeps one. `TRANSPORTS`
gives the SMs per collective kind, `GPU_SMS` the SMs of each profile's GPU, and
`sm_share(kind, hw, transport)` = k / SM count, the share of the SMs an overlapped collective
takes from the compute.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import MeshShape

ALGORITHMS = ("ring", "tree", "auto")


@dataclass(frozen=True)
class LinkTier:
    name: str
    alpha_s: float                # latency per message step, seconds
    bandwidth_bytes_per_s: float  # per GPU, one direction, achievable by a collective
    source: str


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


def get_profile(name: str) -> HardwareProfile:
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(f"unknown hardware profile {name!r}; valid: {', '.join(HARDWARE)}") from None


def collective_time(kind: str, payload_bytes: float, group_size: int, tier: LinkTier,
                    algorithm: str = "auto") -> float:
    """Seconds for one collective of `payload_bytes` over `group_size` ranks on `tier`."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r}; valid: {', '.join(ALGORITHMS)}")
    if group_size < 1 or payload_bytes < 0:
        raise ValueError(f"need group_size >= 1 and payload_bytes >= 0, got {group_size}, {payload_bytes}")
    n, a, bw = group_size, tier.alpha_s, tier.bandwidth_bytes_per_s
    if n == 1:
        return 0.0
    frac = (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) * a + frac * payload_bytes / bw
    if kind == "all_reduce":
        ring = 2 * (n - 1) * a + 2 * frac * payload_bytes / bw
        tree = 2 * math.log2(n) * a + 2 * payload_bytes / bw
        return {"ring": ring, "tree": tree, "auto": min(ring, tree)}[algorithm]
    if kind == "broadcast":
        return math.log2(n) * a + payload_bytes / bw
    raise ValueError(f"unknown collective kind {kind!r}; valid: all_gather, reduce_scatter, all_reduce, "
                     "all_to_all, broadcast")


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
