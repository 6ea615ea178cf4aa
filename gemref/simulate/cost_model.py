"""Alpha-beta cost model of collectives: time = hops x latency + bytes on the wire / bandwidth.

A link tier has a latency alpha (seconds per message step) and a bandwidth beta (bytes/s,
per GPU, one direction, what a collective can use). For a group of n ranks and a payload
of B bytes (payload as in volume.py: all-gather output, reduce-scatter input, all-reduce
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
`gpus_per_node` per node; mesh.py puts a shard group on consecutive ranks) uses the
intra-node tier; any group spanning nodes is bounded by the inter-node tier (one NIC per
GPU, rail-optimised: the per-GPU NIC bandwidth is the bottleneck of every ring step that
leaves the node). Hierarchical algorithms and congestion are not modelled.

`HARDWARE` profiles, `collective_time` and `group_tier` are what the step-time model
(step_model.py) prices a step's collectives with.
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


# Bandwidths: vendor per-GPU link figures (one direction) x 0.8, the share of link bandwidth
# NCCL's bus bandwidth typically reaches in nccl-tests at large messages. Latencies: order
# of magnitude of a small-message step (NVLink ~ a few us; RDMA over InfiniBand/RoCE ~ 5-10 us
# per step including software). Both are assumptions to calibrate with nccl-tests on the
# real cluster (`gemref simulate --bandwidth-scale` varies every bandwidth).
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
