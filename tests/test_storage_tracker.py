"""The one storage tracker (gemref/mfu/memory.py LiveStorages) on a block whose bytes are counted
by hand: AutoAC's activation bytes and the CPU peak both read it.

The block: h = x @ W.t() (Linear 8 -> 16, no bias), r = relu(h), out = r.view(2, 32); the step
sums out. x (4, 8) and W exist before. Every intermediate is 4 x 16 float32 = 256 bytes; the
loss is one float32, 4 bytes. What autograd keeps: mm saves x and W (they existed), relu saves
its output r, view and sum save nothing. So after the forward r (256) and the loss (4) are
alive: 260 bytes; W.t() and out are views (no new storage), h is freed. Fully checkpointed,
the block keeps only its input x: the loss alone, 4 bytes, so "full" frees 256. The peak of the
forward is h and r together: 512 (W.t(), a view of a parameter, never counts).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from gemref.autoac import activation_bytes, apply_plan, profile_blocks, remove_plan
from gemref.mfu.memory import LiveStorages, track_peak_memory

BLOCK_BYTES = 4 * 16 * 4     # one (4, 16) float32 intermediate
LOSS_BYTES = 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 16, bias=False)

    def forward(self, x):
        return torch.relu(self.lin(x)).view(2, 32)


def setup():
    torch.manual_seed(0)
    return nn.Sequential(Block()), torch.randn(4, 8)


def test_alive_bytes_after_a_forward_are_the_hand_count():
    model, x = setup()
    with LiveStorages([*model.parameters(), x]) as live:
        loss = model(x).sum()
    assert live.alive_bytes() == BLOCK_BYTES + LOSS_BYTES
    del loss
    assert live.alive_bytes() == 0


def test_checkpointing_the_block_frees_what_relu_saved():
    model, x = setup()
    step = lambda: model(x).sum()   # noqa: E731
    assert activation_bytes(model, step, [x]) == BLOCK_BYTES + LOSS_BYTES
    apply_plan(model, {"0": "full"})
    assert activation_bytes(model, step, [x]) == LOSS_BYTES
    remove_plan(model)
    profile = profile_blocks(model, ["0"], step, options=("full",), repeats=1, inputs=[x])
    (block,) = profile.blocks
    assert block.saved_bytes == block.freed_bytes["full"] == BLOCK_BYTES
    assert profile.base_bytes == BLOCK_BYTES + LOSS_BYTES


def test_the_peak_counts_new_storages_only_and_each_once():
    model, x = setup()
    with track_peak_memory("cpu") as peak:
        loss = model(x).sum()
    assert peak.bytes == 2 * BLOCK_BYTES, "h and r together; W.t() and the view are no new storage"
    del loss


def test_a_storage_that_existed_before_never_counts_even_when_first_seen_inside():
    """A view or an in-place result of a tensor made before the mode is no new storage (the
    tracker that counted storages on first sight charged it to whichever pass saw it first)."""
    before = torch.zeros(64)
    with LiveStorages() as live:
        view = before[:32]
        before.add_(1)
        new = before * 2
    assert live.alive_bytes() == new.nbytes
    del view


def test_an_opaque_kernels_first_call_caches_are_no_activations():
    """cpu_jagged's op caches its plan and tile biases on the first call (lru_cache): memory, but
    no activation. Counted, they went to whichever pass ran first (the profiler's fully
    checkpointed reference: every block's "full" freed bytes came out short by them)."""
    from gemref.attention.cpu_jagged import plan, tiles
    from gemref.train.presets import get_preset
    from gemref.data.batches import batch_with_lengths
    from gemref.model.gem import GEMRef
    from gemref.train import forward_loss

    cfg = get_preset("tiny").model
    torch.manual_seed(0)
    model = GEMRef(cfg, jagged=True, kernel="cpu_jagged")
    batch = batch_with_lengths(cfg, [5, 9, 2, 30, 64, 17, 3, 40, 1, 12], seed=1)
    plan._cached_plan.cache_clear()
    tiles._mask_bias.cache_clear()
    first, second = (activation_bytes(model, lambda: forward_loss(model, batch), batch.tensors()) for _ in range(2))
    assert first == second
    with track_peak_memory("cpu") as peak:      # the peak does see inside the op: its caches are memory
        forward_loss(model, batch)
    assert peak.bytes > first


def test_a_compiled_cpu_model_is_refused_naming_why():
    """Inductor allocates on CPU without the dispatcher: the tracker would see nothing. The lab
    measures such a model by what it saves (gemref/measure/batch_search.py forward_with_bytes)."""
    from gemref.compile import compile_model

    model, x = setup()
    compile_model(model, ["0"])
    with pytest.raises(ValueError, match="compiled model allocates on CPU without the dispatcher"):
        activation_bytes(model, lambda: model(x).sum(), [x])
