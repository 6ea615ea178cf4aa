"""Collectives priced with NCCL's algorithm choices: ring, tree, PAT, all-to-all with every peer in flight,
and two tiers (NVLink inside a node, the NICs between nodes). Chapters 08 and 11.

Units: bytes, seconds, bytes/s. A link tier (LinkTier) has a latency alpha `a` (seconds per message
step) and a bandwidth `b` (bytes/s per GPU, one direction, what a collective reaches at large sizes).
The payload B is volume.py's (gemref/parallel/volume.py): all-gather output, reduce-scatter input,
all-reduce tensor, all-to-all input. Every price is a CollectiveCost: the latency term (alpha steps)
and the bandwidth term (bytes on the wire) apart, and the algorithm that gave them.

One tier, n ranks, f = (n-1)/n, L = ceil(log2 n) (`algorithm_cost`):

    kind                          algorithm   latency_s              bandwidth_s
    all_gather, reduce_scatter    ring        (n-1) a                f B / b
                                  pat         L a + n PAT_RANK_S     f B / (PAT_BANDWIDTH_SHARE b)
    all_reduce                    ring        2 (n-1) a              2 f B / b
                                  tree        2 L a                  2 B / b       (double binary tree)
    all_to_all                    concurrent  a                      f B / b       (every peer posted at once)
                                  pairwise    (n-1) a                f B / b       (one peer after another)
    broadcast                     ring        (n-1) a                B / b
                                  tree        L a                    B / b

Ring and tree: Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations
in MPICH" (IJHPCA 2005); the double binary tree: Sanders, Speck and Traeff, "Two-tree algorithms for
full bandwidth broadcast, reduction and scan" (Parallel Computing 2009), NCCL's all-reduce tree since
NCCL 2.4. PAT (Parallel Aggregated Trees, NCCL 2.23+, all-gather and reduce-scatter): log2 steps; NCCL's
own tuner (NVIDIA/nccl src/graph/tuning.cc, 2.23 and later) prices it at 0.75 of the ring's bus bandwidth
(PAT_BANDWIDTH_SHARE) and adds 2.8 us per rank ("still a linear part", PAT_RANK_S), and enables it only
with one GPU per node (`ncclPatEnable`: nNodes == nRanks). An NCCL all-to-all is grouped send/recv: the
n-1 transfers are in flight together, so it pays about one message latency, not n-1.

Two tiers (`price`): a group of n ranks, g per node on k = n/g nodes, each GPU with its own NIC
(rail-optimised, as in NVIDIA's DGX designs). A group inside one node runs on NVLink; a group with
one rank per node runs on the NICs (PAT allowed). A group with several ranks on each of several
nodes, by `schedule`:

* "nccl" (default), what stock NCCL runs: all-gather and reduce-scatter as one ring over all n ranks
  (PAT is off with more than one GPU per node), which per pass takes (n-k) NVLink steps and (k-1)
  network steps (tuning.cc) and, its channels leaving each node through g different NICs, puts
  (g-1)/g of its bytes on NVLink and 1/g on each NIC; all-reduce as that ring (twice) or as NCCL's
  tree (chains inside the nodes, a tree across them: latency 2 ((g-1) a_intra + log2(k) a_inter),
  tuning.cc's formula), whichever is faster; all-to-all and broadcast as below.
* "hierarchical", two explicit levels (HSDP's layout made into one collective; what a
  hierarchical implementation gets): an intra-node part on NVLink, then an inter-node part among the
  k ranks with the same local index, in which each GPU's NIC carries 1/g of its node's traffic
  (the node's share):

    all_gather      inter all-gather of B/g over k ranks (ring or PAT), then intra all-gather of B over g
    reduce_scatter  intra reduce-scatter of B over g, then inter reduce-scatter of B/g over k
    all_reduce      intra reduce-scatter of B, inter all-reduce of B/g over k, intra all-gather of B
    broadcast       inter of B over k, then intra of B over g (both schedules)
    all_to_all      concurrent: every peer in flight at once, so the slower tier's one alpha; the
                    (g-1)/n of B for node peers over NVLink, the (k-1)/k of B for other nodes over
                    the GPU's NIC (both schedules)

  The latency terms add up (each part's steps wait for the last); the bandwidth term is the busier
  tier's (NCCL pipelines chunks through both tiers at once, and its tuner prices a multi-node
  collective by one bus bandwidth, the bottleneck's).
* "flat": the whole group on the slower tier with n ranks (what this model did before: every step
  pays the inter-node alpha, every byte the GPU's own NIC).

`algorithm="auto"` takes, part by part, the fastest of NCCL's candidates (ring or tree for all-reduce;
ring, or PAT where a part has one rank per node, for all-gather and reduce-scatter; concurrent for
all-to-all), as NCCL's tuner does from its own latency/bandwidth table. A named algorithm is priced
for the part where the choice lies (the inter-node part of a two-tier group; intra parts stay on their
auto choice); under "nccl", "pat" on a group with several GPUs per node is priced in two tiers (a
what-if: NCCL itself would not run it). Not modelled: NCCL's protocols (LL, LL128, Simple) and
channel counts, NVLink SHARP (NVLS) and CollNet, congestion. The published measurements the model
is checked against, and the error per scale: cost_model.PUBLISHED, cost_model.published_comparison.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from numbers import Integral

# NVIDIA/nccl src/graph/tuning.cc (2.23+): PAT's bus bandwidth is the ring's x 0.75, and its latency adds
# nRanks x 2.8 us ("Still a linear part; hopefully we'll manage to remove it at some point").
PAT_BANDWIDTH_SHARE = 0.75
PAT_RANK_S = 2.8e-6

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_gather": ("ring", "pat"), "reduce_scatter": ("ring", "pat"), "all_reduce": ("ring", "tree"),
    "all_to_all": ("concurrent", "pairwise"), "broadcast": ("ring", "tree")}
# What NCCL picks from with the group laid out as it is: PAT only where one rank per node; an
# all-to-all is always grouped send/recv (pairwise is the sequential reference, gloo's shape).
NCCL_CANDIDATES: dict[str, tuple[str, ...]] = {
    "all_gather": ("ring",), "reduce_scatter": ("ring",), "all_reduce": ("ring", "tree"),
    "all_to_all": ("concurrent",), "broadcast": ("ring", "tree")}
NCCL_ONE_PER_NODE = {"all_gather": ("ring", "pat"), "reduce_scatter": ("ring", "pat")}
SCHEDULES = ("nccl", "hierarchical", "flat")


@dataclass(frozen=True)
class LinkTier:
    name: str
    alpha_s: float                # latency per message step, seconds
    bandwidth_bytes_per_s: float  # per GPU, one direction, achievable by a collective
    source: str


@dataclass(frozen=True)
class CollectiveCost:
    """One collective's time: `latency_s` (message steps x alpha) + `bandwidth_s` (bytes / bandwidth)."""

    latency_s: float
    bandwidth_s: float
    algorithm: str

    @property
    def seconds(self) -> float:
        return self.latency_s + self.bandwidth_s

    def times(self, factor: float) -> "CollectiveCost":
        """`factor` such collectives (a count, or a share of one)."""
        return replace(self, latency_s=self.latency_s * factor, bandwidth_s=self.bandwidth_s * factor)


def _check(kind: str, payload_bytes: float, group_size: int, algorithm: str) -> None:
    if kind not in ALGORITHMS:
        raise ValueError(f"unknown collective kind {kind!r}; valid: {', '.join(ALGORITHMS)}")
    valid = ("auto", *ALGORITHMS[kind])
    every = sorted({a for algs in ALGORITHMS.values() for a in algs})
    if algorithm not in ("auto", *every):
        raise ValueError(f"algorithm={algorithm!r}; valid: auto, {', '.join(every)}")
    if algorithm not in valid:
        raise ValueError(f"algorithm={algorithm!r} does not apply to {kind}; valid: {', '.join(valid)}")
    if isinstance(group_size, bool) or not isinstance(group_size, Integral) or group_size < 1 or payload_bytes < 0:
        raise ValueError(f"need an integer group_size >= 1 and payload_bytes >= 0, got {group_size!r}, "
                         f"{payload_bytes!r}")


def algorithm_cost(kind: str, algorithm: str, payload_bytes: float, group_size: int, tier: LinkTier) -> CollectiveCost:
    """One collective of `kind` with one named algorithm on one tier (the table in the module doc)."""
    _check(kind, payload_bytes, group_size, algorithm)
    if algorithm == "auto":
        raise ValueError("algorithm_cost prices one named algorithm; use best(...) for auto")
    n, a, B, b = group_size, tier.alpha_s, payload_bytes, tier.bandwidth_bytes_per_s
    if n == 1:
        return CollectiveCost(0.0, 0.0, algorithm)
    f, L = (n - 1) / n, math.ceil(math.log2(n))
    steps, wire = {
        ("all_gather", "ring"): ((n - 1) * a, f * B / b),
        ("all_gather", "pat"): (L * a + n * PAT_RANK_S, f * B / (PAT_BANDWIDTH_SHARE * b)),
        ("all_reduce", "ring"): (2 * (n - 1) * a, 2 * f * B / b),
        ("all_reduce", "tree"): (2 * L * a, 2 * B / b),
        ("all_to_all", "concurrent"): (a, f * B / b),
        ("all_to_all", "pairwise"): ((n - 1) * a, f * B / b),
        ("broadcast", "ring"): ((n - 1) * a, B / b),
        ("broadcast", "tree"): (L * a, B / b),
    }[("all_gather" if kind == "reduce_scatter" else kind, algorithm)]
    return CollectiveCost(steps, wire, algorithm)


def best(kind: str, payload_bytes: float, group_size: int, tier: LinkTier, algorithm: str = "auto",
         candidates: tuple[str, ...] | None = None) -> CollectiveCost:
    """`algorithm` on one tier, or with "auto" the fastest of `candidates` (default: every algorithm of the kind)."""
    _check(kind, payload_bytes, group_size, algorithm)
    if algorithm != "auto":
        return algorithm_cost(kind, algorithm, payload_bytes, group_size, tier)
    costs = [algorithm_cost(kind, alg, payload_bytes, group_size, tier) for alg in candidates or ALGORITHMS[kind]]
    return min(costs, key=lambda c: c.seconds)


def collective_time(kind: str, payload_bytes: float, group_size: int, tier: LinkTier,
                    algorithm: str = "auto") -> float:
    """Seconds of one collective on one tier (`best(...).seconds`)."""
    return best(kind, payload_bytes, group_size, tier, algorithm).seconds


def _part(kind: str, payload: float, n: int, tier: LinkTier, algorithm: str, one_per_node: bool) -> CollectiveCost:
    """One tier's part: a named algorithm as asked, else NCCL's candidates for that layout."""
    if algorithm != "auto":
        return best(kind, payload, n, tier, algorithm)
    candidates = NCCL_ONE_PER_NODE.get(kind, NCCL_CANDIDATES[kind]) if one_per_node else NCCL_CANDIDATES[kind]
    return best(kind, payload, n, tier, "auto", candidates)


def _spanning_ring(kind: str, B: float, n: int, g: int, k: int, intra: LinkTier, inter: LinkTier) -> CollectiveCost:
    """NCCL's ring laid over k nodes of g ranks: per pass (n-k) NVLink steps and (k-1) network steps
    (tuning.cc's nsteps - nInterSteps and nInterSteps); its g channels leave each node through g
    different NICs, so NVLink carries (g-1)/g of the ring's bytes and each NIC 1/g of them."""
    passes = 2 if kind == "all_reduce" else 1
    wire = passes * (n - 1) / n * B
    latency = passes * ((n - k) * intra.alpha_s + (k - 1) * inter.alpha_s)
    bandwidth = max(wire * (g - 1) / g / intra.bandwidth_bytes_per_s, wire / g / inter.bandwidth_bytes_per_s)
    return CollectiveCost(latency, bandwidth, "ring")


def _two_tier(kind: str, B: float, g: int, k: int, intra: LinkTier, inter: LinkTier, algorithm: str) -> CollectiveCost:
    """Intra-node part(s) on NVLink, inter-node part among the k ranks of one local index (module doc)."""
    if kind == "all_reduce":
        intra_parts = [_part("reduce_scatter", B, g, intra, "auto", False),
                       _part("all_gather", B, g, intra, "auto", False)]
        inter_part = _part("all_reduce", B / g, k, inter, algorithm, one_per_node=True)
    elif kind == "broadcast":
        intra_parts = [_part(kind, B, g, intra, "auto", False)]
        inter_part = _part(kind, B, k, inter, algorithm, one_per_node=True)
    else:
        intra_parts = [_part(kind, B, g, intra, "auto", False)]
        inter_part = _part(kind, B / g, k, inter, algorithm, one_per_node=True)
    latency = sum(p.latency_s for p in intra_parts) + inter_part.latency_s
    bandwidth = max(sum(p.bandwidth_s for p in intra_parts), inter_part.bandwidth_s)
    return CollectiveCost(latency, bandwidth, f"{intra_parts[0].algorithm}+{inter_part.algorithm}")


def price(kind: str, payload_bytes: float, group_size: int, ranks_per_node: int, intra: LinkTier,
          inter: LinkTier, algorithm: str = "auto", schedule: str = "nccl") -> CollectiveCost:
    """One collective over `group_size` ranks laid out `ranks_per_node` to a node (module doc: two tiers)."""
    _check(kind, payload_bytes, group_size, algorithm)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}; valid: {', '.join(SCHEDULES)}")
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, Integral) or ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be an integer >= 1, got {ranks_per_node!r}")
    n, B = group_size, payload_bytes
    g = min(ranks_per_node, n)
    if n % g:
        raise ValueError(f"a group of {n} ranks cannot hold {g} per node: give a divisor of {n}")
    k = n // g
    if k == 1:
        return _part(kind, B, n, intra, algorithm, one_per_node=False)
    if g == 1:
        return _part(kind, B, n, inter, algorithm, one_per_node=True)
    if schedule == "flat" or (kind == "all_to_all" and algorithm == "pairwise"):
        return _part(kind, B, n, inter, algorithm, one_per_node=False)
    if kind == "all_to_all":
        local = (g - 1) / n * B / intra.bandwidth_bytes_per_s
        remote = (k - 1) / k * B / inter.bandwidth_bytes_per_s
        return CollectiveCost(max(intra.alpha_s, inter.alpha_s), max(local, remote), "concurrent")
    if schedule == "hierarchical" or kind == "broadcast":
        return _two_tier(kind, B, g, k, intra, inter, algorithm)
    # schedule "nccl": what stock NCCL runs with several GPUs per node
    if kind in ("all_gather", "reduce_scatter"):        # PAT needs one GPU per node: the ring (a named "pat": two tiers)
        return _spanning_ring(kind, B, n, g, k, intra, inter) if algorithm in ("auto", "ring") else \
            _two_tier(kind, B, g, k, intra, inter, algorithm)
    ring = _spanning_ring(kind, B, n, g, k, intra, inter)
    tree = replace(_two_tier(kind, B, g, k, intra, inter, "tree"), algorithm="tree")   # chains in the node, a tree across
    return {"ring": ring, "tree": tree}.get(algorithm) or min((ring, tree), key=lambda c: c.seconds)


BUS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
               "broadcast": lambda n: 1.0}


def bus_bandwidth(kind: str, payload_bytes: float, group_size: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth (bytes/s): payload / seconds x the collective's correction factor,
    2(n-1)/n all-reduce, (n-1)/n all-gather, reduce-scatter and all-to-all, 1 broadcast
    (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md), so a ring at large sizes
    reads its link's bandwidth whatever n."""
    if kind not in BUS_FACTORS:
        raise ValueError(f"unknown collective kind {kind!r}; valid: {', '.join(BUS_FACTORS)}")
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    return payload_bytes / seconds * BUS_FACTORS[kind](group_size)
