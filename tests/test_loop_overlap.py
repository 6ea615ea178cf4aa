"""The loop that overlaps (gemref/train/loop.py `overlap`, gemref/mfu/timing.py StepClock): step k
is read back after step k + 1 is launched, timed by events on the device's stream. On a CPU the
same loop runs with overlap=True and must train exactly as without it; the CUDA clock is checked
with fake events (no GPU here: the real events have not run)."""
import pytest
import torch

from gemref.checkpoint import latest_checkpoint
from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.mfu.timing import StepFlops, timed_step
from gemref.step import NonFiniteError
from gemref.train import setup, train

from test_train import poison_forward

TINY = get_preset("tiny")


def test_overlapped_training_is_the_same_training(data_root):
    cfg = override(TINY.train, steps=6, warmup_steps=1, eval_batches=1, eval_every=3)
    plain = train(setup(TINY, cfg, device="cpu", data_root=data_root), progress=False, overlap=False)
    ahead = train(setup(TINY, cfg, device="cpu", data_root=data_root), progress=False, overlap=True)
    assert [r.loss for r in ahead.steps] == [r.loss for r in plain.steps]
    assert [r.step for r in ahead.steps] == list(range(1, 7))
    assert ahead.evals == plain.evals and len(ahead.evals) == 2


def test_a_bad_step_read_late_still_stops_before_any_save(data_root, tmp_path, monkeypatch):
    """Step 5 (not a checkpoint step) turns NaN: it is read after step 6 launched, and the run stops
    naming step 5, with checkpoint 4 the last good state (step 6 is never saved)."""
    folder = tmp_path / "ckpt"
    cfg = override(TINY.train, steps=8, warmup_steps=1, eval_batches=1, checkpoint_dir=str(folder), checkpoint_every=2)
    poison_forward(monkeypatch, call=5, where="loss")
    with pytest.raises(NonFiniteError, match="training step 5 produced a non-finite loss") as error:
        train(setup(TINY, cfg, device="cpu", data_root=data_root), progress=False, overlap=True)
    assert error.value.step == 5 and latest_checkpoint(folder)[0] == 4


class FakeEvent:
    """torch.cuda.Event's timing API on a fake device clock (`now`, ms, advanced by hand), counting waits."""
    waits = 0
    now = 0.0

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None

    def record(self, stream=None):
        self.t = FakeEvent.now

    def synchronize(self):
        FakeEvent.waits += 1

    def elapsed_time(self, end):
        return end.t - self.t


def device_work(ms):
    def run(batch):
        FakeEvent.now += ms                 # the device computes for `ms` between the step's two events
    return run


def test_the_cuda_step_clock_waits_for_nothing_until_it_is_read(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("a device-wide synchronize in the step"))
    FakeEvent.waits, FakeEvent.now = 0, 0.0
    batch = type("B", (), {"batch_size": 2, "num_tokens": 5, "lengths": torch.tensor([2, 3])})()
    count = lambda lengths: StepFlops(10, 12, 0)      # noqa: E731
    first, _, _ = timed_step(lambda: batch, device_work(10.0), "cuda", count, defer=True)
    FakeEvent.now += 20.0                               # the device idles: the host is late with the next step
    second, _, _ = timed_step(lambda: batch, device_work(30.0), "cuda", count, defer=True, after=first)
    assert FakeEvent.waits == 0                         # launching two steps waited for nothing
    a, b = first.resolve(), second.resolve()
    assert FakeEvent.waits >= 2                         # reading them waits for their end events
    assert (b.step_s, b.data_s, b.wall_s) == pytest.approx((0.030, 0.020, 0.050))   # the device's view
    assert a.step_s == pytest.approx(0.010) and a.model_flops == 10 and a.executed_flops == 12 and a.tokens == 5
