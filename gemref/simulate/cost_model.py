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

This is the API the scale projection (`gemref simulate`) uses: `HARDWARE` profiles,
`collective_time`, `group_tier`, `step_comm_time` (a volume.py step at a mesh shape).
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
# real cluster (`gemref simulate project --bandwidth-scale` scales them).
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


def step_comm_time(rows: list[dict], mesh: MeshShape, hw: HardwareProfile, algorithm: str = "auto") -> list[dict]:
    """volume.step_volume rows -> the same rows with `tier` and `seconds` (count collectives of equal size)."""
    out = []
    for r in rows:
        tier = group_tier(r["dim"], mesh, hw)
        per_call = r["bytes"] / r["count"] if r["count"] else 0.0
        seconds = r["count"] * collective_time(r["kind"], per_call, r["group_size"], tier, algorithm)
        out.append({**r, "tier": tier.name, "seconds": seconds})
    return out


def comm_share(compute_s: float, comm_s: float, overlapped_share: float = 0.0) -> float:
    """Share of the step spent on exposed communication: exposed / (compute + exposed)."""
    if not 0.0 <= overlapped_share <= 1.0:
        raise ValueError(f"overlapped_share must be in [0, 1], got {overlapped_share}")
    exposed = comm_s * (1.0 - overlapped_share)
    total = compute_s + exposed
    return exposed / total if total > 0 else 0.0




def step_time(compute_s: float, comm_s: float, overlapped_share: float, sm_share: float = 0.0) -> float:
    """Step time when `overlapped_share` of the comm runs under compute.

    `sm_share` is the fraction of the GPU's SMs a collective's kernels occupy while they run:
    overlapped comm then slows the compute it overlaps by that fraction of its duration.
    Kernel-driven NCCL collectives take a few SMs per channel; NCCLX's host-driven,
    zero-copy CTran transport moves data by RDMA without SMs (sm_share ~ 0). An assumption
    to set from a profile, not a measured constant.
    """
    for name, v in (("overlapped_share", overlapped_share), ("sm_share", sm_share)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {v}")
    overlapped = comm_s * overlapped_share
    return compute_s + (comm_s - overlapped) + overlapped * sm_share


def projected_step(cfg, mesh: MeshShape, hw: HardwareProfile, *, batch: int, tokens: int, model_flops: float,
                   mfu: float, jagged: bool = True, sparse_sharding: str = "row", reshard_after_forward: bool = True,
                   param_bytes: int = 2, algorithm: str = "auto") -> dict:
    """One rank's step at scale: compute time from its model FLOPs at an assumed MFU (against the
    GPU's bf16 peak), comm time of every collective (volume.py) on this hardware, the comm share
    with no overlap. `batch`/`tokens`: samples and history events per rank."""
    from ..mfu.peak import gpu_peak
    from ..parallel.volume import step_volume

    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    peak = gpu_peak(hw.gpu, "bf16")
    if peak.flops is None:
        raise ValueError(f"hardware profile {hw.name!r}: no bf16 peak for GPU {hw.gpu!r}")
    rows = step_comm_time(step_volume(cfg, mesh, batch=batch, tokens=tokens, jagged=jagged, param_bytes=param_bytes,
                                      reshard_after_forward=reshard_after_forward, sparse_sharding=sparse_sharding),
                          mesh, hw, algorithm)
    compute_s = model_flops / (peak.flops * mfu)
    comm_s = sum(r["seconds"] for r in rows)
    return {"compute_s": compute_s, "comm_s": comm_s, "comm_share_no_overlap": comm_share(compute_s, comm_s),
            "peak_source": peak.source, "collectives": rows}
