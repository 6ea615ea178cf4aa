"""Rung 5: load balancing of variable-length samples across data-parallel ranks.

    cost.py       the price of one sample (c0 + c1*L + c2*L^2), input checks, `calibrate`
    partition.py  global policies: split each global batch by cost (round_robin, sorted_chunk,
                  lpt, kk), imbalance figures, the loss scale that keeps gradients exact
    local.py      policy "local": each rank reorders its own samples across steps, no exchange
    compare.py    every policy side by side over the steps of an epoch (simulated ranks)

The samplers that use them are in gemref/data/sampler.py.
"""
from .cost import Calibration, SampleCost, _nnls, calibrate, check_costs, check_lengths
from .local import LOCAL, closest_subset, displacement, local_rank_batches, local_schedule
from .partition import (KK_MAX_WORK, POLICIES, Partition, compare_policies, idle_fraction, imbalance,
                        karmarkar_karp, kk_refined, lpt, partition, rank_loads, rank_loss_scale, refine,
                        round_robin, sorted_chunk)

# Policies a BalancedDistributedBatchSampler takes: the global ones and "local".
SAMPLER_POLICIES = (*POLICIES, LOCAL)
