"""Load balancing of variable-length samples across data-parallel ranks (rung 5, chapter 06).

The idea: in data parallelism every rank waits for the slowest at the gradient all-reduce, and
with skewed history lengths equal sample COUNTS are very unequal WORK (attention grows with
L^2). So price every sample (`cost.py`: c0 + c1*L + c2*L^2 in FLOPs or fitted seconds, or
any callable), split each global batch so that every rank's summed cost is the same
(`partition.py`: LPT, Karmarkar-Karp refined by local search, or "local", which only reorders
each rank's own samples across nearby steps and exchanges nothing), and divide every rank's
summed loss by the same `loss_divisor` so the gradient is the global batch's, whatever the
per-rank counts. The lab puts the policies side by side (gemref/measure/balance_compare.py,
the one comparison); `config.py` holds the switch (BalanceConfig: `--balance` and its valid
policies).

To copy it into a trainer: build `gemref.data.sampler.BalancedDistributedBatchSampler(lengths,
global_batch_size, cost, rank=, world_size=, policy="kk")` as the DataLoader's batch_sampler;
compute `loss = per_sample_loss.sum() / loss_divisor(sampler.global_size(step), world,
grad_reduce)` on every rank. tests/test_balance.py does exactly that on a model gemref did not
define (tests/my_rec.py).
"""
from .cost import Calibration, CostLike, SampleCost, calibrate, check_costs, check_lengths, nnls, sample_costs
from .partition import (ALIASES, KK_MAX_WORK, LOCAL, POLICIES, Partition, check_int, check_policy, closest_subset,
                        karmarkar_karp, kk_refined, local_rank_batches,
                        local_schedule, loss_divisor, lpt, partition, rank_loads, refine, round_robin, sorted_chunk)

# Policies a BalancedDistributedBatchSampler takes: the global ones and "local".
SAMPLER_POLICIES = (*POLICIES, LOCAL)
