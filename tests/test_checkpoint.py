"""Checkpoints in one process: exact resume (parameters, AdamW state, row-wise table state, RNG bit
for bit), every crash point of a save, corrupt and foreign checkpoints, folder ownership. The multi-rank
crash (a rank killed mid-save) and parity live in test_parallel_train.py."""
import dataclasses
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from gemref.train.presets import get_preset
from gemref.train.override import override
from gemref.data.batches import batch_with_lengths
from gemref.model.gem import GEMRef, ranking_loss
from gemref.checkpoint.folder import complete_checkpoints
from gemref.parallel.rowwise import row_state_dict
from gemref.train.compose import make_optimizer
from gemref.checkpoint import (latest_checkpoint, load_checkpoint, resume_checkpoint, save_checkpoint,
                               start_from_checkpoint)
from gemref.train.loop import run_description

TINY = get_preset("tiny")
KEY = dict(global_batch=4, seed=0)
BATCHES = [batch_with_lengths(TINY.model, [3, 9, 1, 14], seed=i) for i in range(6)]


class Killed(BaseException):
    """A process dying at this point (no except clause of ours catches a BaseException)."""


def _fresh(seed: int = 0, cfg=TINY.model):
    torch.manual_seed(seed)
    model = GEMRef(cfg, jagged=True)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(model, opt, batch) -> None:
    """One step that also draws from the RNG (as dropout would), so a lost RNG state shows."""
    opt.zero_grad(set_to_none=True)
    scale = 1 + 0.01 * torch.rand(())
    (ranking_loss(model(batch), batch.labels) * scale).backward()
    opt.step()


def _snapshot(model, opt) -> dict:
    state = opt.state_dict()["state"]
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "optim": {i: {k: v.clone() for k, v in s.items()} for i, s in state.items()},
            "rng": torch.get_rng_state()}


def _assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a["params"].keys() == b["params"].keys()
    for name in a["params"]:
        assert torch.equal(a["params"][name], b["params"][name]), name
    assert a["optim"].keys() == b["optim"].keys() and len(a["optim"]) > 0
    for i in a["optim"]:
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(a["optim"][i][k], b["optim"][i][k]), (i, k)
    assert torch.equal(a["rng"], b["rng"])


def _train(folder, steps: int, save_every: int, **save_kwargs):
    model, opt = _fresh()
    for step in range(steps):
        _step(model, opt, BATCHES[step])
        if (step + 1) % save_every == 0:
            save_checkpoint(folder, step + 1, model, opt, **KEY, **save_kwargs)
    return model, opt


def test_resume_is_bit_exact_in_parameters_optimizer_and_rng(tmp_path):
    model, opt = _fresh()
    for step in range(4):
        _step(model, opt, BATCHES[step])
        if step + 1 == 2:
            save_checkpoint(tmp_path, 2, model, opt, **KEY)
            at_save = _snapshot(model, opt)
    full = _snapshot(model, opt)

    other, other_opt = _fresh(seed=1)             # different weights ...
    _step(other, other_opt, BATCHES[5])           # ... and optimizer state ...
    torch.manual_seed(99)                         # ... and RNG: the load must replace all three
    assert not torch.equal(next(other.parameters()), at_save["params"][next(iter(at_save["params"]))])
    assert load_checkpoint(tmp_path / "step-00000002", other, other_opt, **KEY) == 2
    _assert_bitwise_equal(_snapshot(other, other_opt), at_save)
    for step in range(2, 4):
        _step(other, other_opt, BATCHES[step])
    _assert_bitwise_equal(_snapshot(other, other_opt), full)


def _row_state(model) -> dict:
    return {k: v.clone() for k, v in row_state_dict(model).items()}


@pytest.mark.parametrize("table_optimizer", ["rowwise_adagrad", "rowwise_adam"])
def test_resume_restores_the_tables_row_wise_optimizer_state_bit_for_bit(tmp_path, table_optimizer):
    """Tables stepped inside backward keep their state outside `opt` (gemref/parallel/rowwise.py):
    2 steps, save, 2 more equals a fresh model loaded from the save and stepped the same 2."""
    train = override(TINY.train, table_optimizer=table_optimizer)

    def fresh(seed=0):
        torch.manual_seed(seed)
        model = GEMRef(TINY.model, jagged=True)
        return model, make_optimizer(model, train)

    model, opt = fresh()
    for step in range(4):
        _step(model, opt, BATCHES[step])
        if step + 1 == 2:
            save_checkpoint(tmp_path, 2, model, opt, **KEY)
            at_save = _row_state(model)
    full, full_rows = _snapshot(model, opt), _row_state(model)
    assert full_rows["tables.item.step"] == 4 and any(bool(v.ne(0).any()) for k, v in full_rows.items()
                                                       if not k.endswith(".step"))
    other, other_opt = fresh(seed=1)
    _step(other, other_opt, BATCHES[5])           # other row state and step count: the load replaces them
    assert load_checkpoint(tmp_path / "step-00000002", other, other_opt, **KEY) == 2
    loaded = _row_state(other)
    assert loaded.keys() == at_save.keys() and all(torch.equal(loaded[k], at_save[k]) for k in at_save)
    for step in range(2, 4):
        _step(other, other_opt, BATCHES[step])
    _assert_bitwise_equal(_snapshot(other, other_opt), full)
    resumed_rows = _row_state(other)
    assert all(torch.equal(resumed_rows[k], full_rows[k]) for k in full_rows)


def _kill_in_shard_write(monkeypatch, step):
    write = FileSystemWriter.write_data

    def write_then_die(self, plan, planner):
        done = write(self, plan, planner)
        done.wait()
        if f"step-{step:08d}" in str(self.path):
            raise Killed("shards written, .metadata and checkpoint.json not")
        return done
    monkeypatch.setattr(FileSystemWriter, "write_data", write_then_die)


def _kill_in_final_rename(monkeypatch, step):
    replace = os.replace

    def die_on_publish(src, dst):
        if Path(src).name == f".tmp-step-{step:08d}":
            assert (Path(src) / "checkpoint.json").is_file()    # the manifest was written before
            raise Killed("during the final rename")
        return replace(src, dst)
    monkeypatch.setattr(os, "replace", die_on_publish)


@pytest.mark.parametrize("kill", [_kill_in_shard_write, _kill_in_final_rename])
def test_a_kill_during_a_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, kill):
    model, opt = _train(tmp_path, 2, 2)
    at_two = _snapshot(model, opt)
    _step(model, opt, BATCHES[2])
    _step(model, opt, BATCHES[3])
    kill(monkeypatch, 4)
    with pytest.raises(BaseException) as info:
        save_checkpoint(tmp_path, 4, model, opt, **KEY)
    assert "Killed" in repr(info.value) or isinstance(info.value, Killed)
    monkeypatch.undo()
    assert (tmp_path / ".tmp-step-00000004").is_dir() and not (tmp_path / "step-00000004").exists()
    assert resume_checkpoint(tmp_path) == (2, tmp_path / "step-00000002")
    resumed, resumed_opt = _fresh(seed=3)
    assert start_from_checkpoint(tmp_path, resumed, resumed_opt, **KEY, resume=True) == 2
    _assert_bitwise_equal(_snapshot(resumed, resumed_opt), at_two)
    save_checkpoint(tmp_path, 4, model, opt, **KEY)             # the next save clears the wreck
    assert latest_checkpoint(tmp_path)[0] == 4 and not list(tmp_path.glob(".tmp-*"))


def test_a_kill_while_pruning_leaves_the_new_checkpoint(tmp_path, monkeypatch):
    model, opt = _train(tmp_path, 4, 2, keep=1)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("step-")] == ["step-00000004"]
    rmtree = shutil.rmtree

    def die_in_trash(path, *args, **kwargs):
        if Path(path).name.startswith(".trash-step") and Path(path).exists():
            (Path(path) / "checkpoint.json").unlink(missing_ok=True)     # half deleted
            raise Killed("while pruning")
        return rmtree(path, *args, **kwargs)
    monkeypatch.setattr(shutil, "rmtree", die_in_trash)
    _step(model, opt, BATCHES[4])
    with pytest.raises(Killed):
        save_checkpoint(tmp_path, 5, model, opt, **KEY, keep=1)
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path)[0] == 5
    assert load_checkpoint(tmp_path / "step-00000005", *_fresh(), **KEY) == 5


def _damage(folder: Path, how: str) -> str:
    """Damage a complete checkpoint; return the file the error must name."""
    shard = next(folder.glob("*.distcp"))
    if how == "truncated .distcp":
        shard.write_bytes(shard.read_bytes()[:-100])
        return shard.name
    if how == "flipped byte in .distcp":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
        return shard.name
    if how == "corrupt .metadata":
        meta = folder / ".metadata"
        meta.write_bytes(b"\x80\x04garbage" + meta.read_bytes()[9:])
        return ".metadata"
    if how == "corrupt checkpoint.json":
        (folder / "checkpoint.json").write_text('{"format": ')
        return "checkpoint.json"
    if how == "missing file":
        shard.unlink()
        return shard.name
    if how == "extra file":
        (folder / "__9_0.distcp").write_bytes(b"x")
        return "__9_0.distcp"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["truncated .distcp", "flipped byte in .distcp", "corrupt .metadata",
                                 "corrupt checkpoint.json", "missing file", "extra file"])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path, how):
    _train(tmp_path, 4, 2)
    name = _damage(tmp_path / "step-00000004", how)
    model, opt = _fresh()
    with pytest.raises(ValueError) as info:
        start_from_checkpoint(tmp_path, model, opt, **KEY, resume=True)
    message = str(info.value)
    assert name in message and "\n" not in message, message
    assert "step-00000004" in message          # the newest is damaged: no silent fall-back to step 2


def test_a_crafted_metadata_is_refused_before_it_is_unpickled(tmp_path):
    _train(tmp_path, 2, 2)
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))
    (tmp_path / "step-00000002" / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ValueError, match=r"\.metadata: .*(bytes|sha256)"):
        start_from_checkpoint(tmp_path, *_fresh(), **KEY, resume=True)
    assert not marker.exists()
    pickle.loads((tmp_path / "step-00000002" / ".metadata").read_bytes())
    assert marker.exists(), "the payload works when unpickled, so the check above proves something"


def test_a_checkpoint_of_another_preset_or_run_is_refused(tmp_path):
    _train(tmp_path, 2, 2, run=run_description(TINY, TINY.train))
    wider = dataclasses.replace(TINY.model, d_model=48)
    with pytest.raises(ValueError, match=r"another run \(run\.model\.d_model: 32 in the checkpoint, 48 in this run\)"):
        load_checkpoint(tmp_path / "step-00000002", *_fresh(cfg=wider), **KEY,
                        run=run_description(dataclasses.replace(TINY, model=wider), TINY.train))
    with pytest.raises(ValueError, match=r"tensors\.dense_proj\.bias: \[\[32\], 'float32'\] in the checkpoint, "
                                         r"\[\[48\], 'float32'\] in this run"):
        load_checkpoint(tmp_path / "step-00000002", *_fresh(cfg=wider), **KEY, run=run_description(TINY, TINY.train))
    with pytest.raises(ValueError, match=r"run\.train\.lr: 0\.003 in the checkpoint, 0\.1 in this run"):
        load_checkpoint(tmp_path / "step-00000002", *_fresh(), **KEY,
                        run=run_description(TINY, override(TINY.train, lr=0.1)))
    with pytest.raises(ValueError, match=r"seed: 0 in the checkpoint, 7 in this run"):
        load_checkpoint(tmp_path / "step-00000002", *_fresh(), global_batch=4, seed=7,
                        run=run_description(TINY, TINY.train))
    same = run_description(TINY, override(TINY.train, steps=999, eval_every=5, compile=True))
    assert load_checkpoint(tmp_path / "step-00000002", *_fresh(), **KEY, run=same) == 2


def test_a_folder_belongs_to_one_run(tmp_path):
    _train(tmp_path, 4, 2)
    model, opt = _fresh()
    with pytest.raises(ValueError, match=r"belongs to another run \(seed: 0 in its owner.json, 1 in this run\); "
                                         r"choose another folder, or overwrite it"):
        save_checkpoint(tmp_path, 2, model, opt, global_batch=4, seed=1)
    with pytest.raises(ValueError, match="belongs to another run"):
        start_from_checkpoint(tmp_path, model, opt, global_batch=4, seed=1, resume=False)
    assert latest_checkpoint(tmp_path)[0] == 4, "a refused run must not touch the folder"
    start_from_checkpoint(tmp_path, model, opt, global_batch=4, seed=1, resume=False, overwrite=True)
    assert latest_checkpoint(tmp_path) is None
    save_checkpoint(tmp_path, 2, model, opt, global_batch=4, seed=1)
    with pytest.raises(ValueError, match="seed: 1 in the checkpoint, 0 in this run"):
        start_from_checkpoint(tmp_path, *_fresh(), **KEY, resume=True)


def test_a_fresh_run_does_not_shadow_or_prune_its_own_later_checkpoints(tmp_path):
    _train(tmp_path, 4, 2)
    model, opt = _fresh()
    with pytest.raises(ValueError, match="already holds step-00000004 of this run; resume from it, choose another folder, or overwrite"):
        start_from_checkpoint(tmp_path, model, opt, **KEY, resume=False)
    with pytest.raises(ValueError, match="already holds step-00000004 of this run, not older than step 2"):
        save_checkpoint(tmp_path, 2, model, opt, **KEY)
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2, 4]
    save_checkpoint(tmp_path, 2, model, opt, **KEY, overwrite=True)
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2]


def test_resume_needs_a_folder_with_a_complete_checkpoint(tmp_path):
    model, opt = _fresh()
    with pytest.raises(ValueError, match="nowhere: not an existing checkpoint folder"):
        start_from_checkpoint(tmp_path / "nowhere", model, opt, **KEY, resume=True)
    (tmp_path / ".tmp-step-00000002").mkdir()
    with pytest.raises(ValueError, match=r"no complete checkpoint to resume from \(incomplete saves: .tmp-step-00000002\)"):
        start_from_checkpoint(tmp_path, model, opt, **KEY, resume=True)
    with pytest.raises(ValueError, match="contradict"):
        start_from_checkpoint(tmp_path, model, opt, **KEY, resume=True, overwrite=True)


def test_a_folder_that_is_not_ours_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    model, opt = _fresh()
    with pytest.raises(ValueError, match="not empty and has no owner.json"):
        save_checkpoint(tmp_path, 1, model, opt, **KEY)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="file: not a folder"):
        save_checkpoint(tmp_path / "file", 1, model, opt, **KEY)
    save_checkpoint(tmp_path, 1, model, opt, **KEY, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine", "overwrite deletes checkpoints only"
