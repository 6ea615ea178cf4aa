"""No host sync on the training step's path (issue: a GPU loop that overlaps).

On a GPU every op whose result the host must read (`.item()`, `int(t)`, `bool(t)`, `.tolist()`,
`torch.equal`, `nonzero`, a boolean-mask index, `repeat_interleave` without `output_size`) stalls
the host until the device catches up, so the next step's launches cannot run ahead. Counted here
on a CPU with a dispatch mode: one whole step (forward, backward, optimizer) of gemref's model.
The attention kernels are apart: gdpa's value checks run on CPU only (gemref/attention/api.py
skips them on CUDA) and the CPU kernels are not the GPU's."""
import traceback
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.data.loader import make_loader
from gemref.train.compose import setup

aten = torch.ops.aten
SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default, aten.equal.default,
           aten.is_nonzero.default, aten._unique2.default, aten.unique_consecutive.default}
REPEAT = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}


class HostSyncs(TorchDispatchMode):
    """Counts syncing ops by the innermost gemref line that issued them; `.tolist()` too."""

    def __init__(self):
        super().__init__()
        self.where: Counter = Counter()
        self.active = False

    def __enter__(self):
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.active = False
        return super().__exit__(*exc)

    def note(self, what: str) -> None:
        frames = [f for f in traceback.extract_stack() if "/gemref/" in f.filename]
        kernel = any("/gemref/attention/" in f.filename for f in frames)
        self.where[("attention" if kernel else "step", what,
                    f"{frames[-1].filename.split('/gemref/')[-1]}:{frames[-1].lineno}" if frames else "?")] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNCING or (func in REPEAT and kwargs.get("output_size") is None):
            self.note(str(func))
        return func(*args, **kwargs)


@pytest.fixture
def count_tolist(monkeypatch):
    mode = HostSyncs()
    real = torch.Tensor.tolist

    def tolist(t):
        if mode.active:                 # inside the counted step only (a sampler's randperm is not in it)
            mode.note("tolist")
        return real(t)
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    return mode


@pytest.mark.parametrize("jagged", [False, True])
def test_a_training_step_reads_nothing_back_from_the_device(data_root, count_tolist, jagged):
    preset = get_preset("tiny")
    s = setup(preset, override(preset.train, steps=2, jagged=jagged), device="cpu", data_root=data_root)
    batch = next(iter(make_loader(s.train_set, s.train.batch_size, seed=0)))
    s.step(batch)
    with count_tolist:
        s.step(batch)
    in_step = {k: n for k, n in count_tolist.where.items() if k[0] == "step"}
    assert in_step == {}, in_step


def test_the_counter_sees_a_sync_planted_in_the_step(data_root, count_tolist, monkeypatch):
    from gemref.model import gem

    preset = get_preset("tiny")
    s = setup(preset, override(preset.train, steps=2), device="cpu", data_root=data_root)
    batch = next(iter(make_loader(s.train_set, s.train.batch_size, seed=0)))
    real = gem.GEMRef.layout
    monkeypatch.setattr(gem.GEMRef, "layout", lambda self, b: (int(b.offsets[-1]), b.lengths.tolist(), real(self, b))[2])
    with count_tolist:
        s.step(batch)
    assert {k[1] for k in count_tolist.where if k[0] == "step"} == {"aten._local_scalar_dense.default", "tolist"}


def test_a_batch_knows_its_longest_history_on_the_host(tiny_dataset):
    batch = next(iter(make_loader(tiny_dataset, 16, seed=0)))
    assert batch.host_max_length == int(batch.lengths.max())
    part = batch.select([3, 1])
    assert part.host_max_length == int(part.lengths.max())
    joined = type(batch).concat([part, batch.select([0])])
    assert joined.host_max_length == int(joined.lengths.max())
    assert batch.to("cpu").host_max_length == batch.host_max_length
    with pytest.raises(ValueError, match="host_max_length"):
        batch.with_host_max_length(-1)
