"""One writer per folder: a second gemref process writing a folder another one holds
(checkpoints, a dataset, a waterfall's or the notebooks' --out) is refused in one line naming
the folder and the holder's pid; a killed holder releases the folder (gemref/runtime/locks.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gemref.cli import main
from gemref.errors import UsageError
from gemref.checkpoint.folder import claim_folder
from gemref.runtime.locks import LOCK_NAME, folder_lock, holder

HOLD = "import sys, time; from gemref.runtime.locks import folder_lock\n" \
       "with folder_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)\n"


@pytest.fixture
def held(tmp_path):
    """A folder whose lock another process holds; yields (folder, that process)."""
    folder = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout.readline().strip() == "held"
    yield folder, proc
    proc.kill()
    proc.wait(timeout=30)


def test_a_held_folder_is_refused_naming_it_and_the_holder(held):
    folder, proc = held
    assert holder(folder / LOCK_NAME) == proc.pid
    with pytest.raises(UsageError, match=rf"{folder}: in use by another gemref process \(pid {proc.pid}\)"):
        with folder_lock(folder):
            pass


def test_a_killed_holder_releases_the_folder(held):
    folder, proc = held
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    with folder_lock(folder) as f:          # the kernel dropped the flock with the process
        assert f == folder and holder(folder / LOCK_NAME) == os.getpid()
    with folder_lock(folder):               # and this one released it on leaving the block
        pass


def test_the_lock_is_reentrant_across_blocks_not_processes(tmp_path):
    with folder_lock(tmp_path / "a"):
        with folder_lock(tmp_path / "b"):   # other folders are independent
            pass
    with folder_lock(tmp_path / "a"):
        pass


def test_a_torchrun_rank_other_than_0_leaves_the_lock_to_rank_0(held, monkeypatch):
    folder, _ = held
    for name, value in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT="29500").items():
        monkeypatch.setenv(name, value)
    with folder_lock(folder):
        pass
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UsageError, match="in use"):
        with folder_lock(folder):
            pass


@pytest.mark.parametrize("argv, flag", [
    (["data", "generate", "--preset", "tiny", "--quiet", "--out"], "--out"),
    (["waterfall", "--preset", "tiny", "--out"], "--out"),
    (["notebooks", "build", "00_mfu_baseline", "--out"], "--out"),
    (["notebooks", "run", "00_mfu_baseline", "--out"], "--out"),
    (["train", "--preset", "tiny", "--steps", "2", "--checkpoint-every", "1", "--quiet", "--checkpoint-dir"],
     "--checkpoint-dir"),
])
def test_every_writer_of_a_folder_is_refused_while_another_holds_it(held, capsys, argv, flag):
    folder, proc = held
    before = sorted(p.name for p in folder.iterdir())
    assert main([*argv, str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} {folder}: in use by another gemref process (pid {proc.pid})" in err
    assert sorted(p.name for p in folder.iterdir()) == before == [LOCK_NAME]     # nothing written


def test_a_checkpoint_folder_holding_only_its_lock_is_still_empty(tmp_path):
    with folder_lock(tmp_path / "ckpt") as folder:
        claim_folder(folder, {"run": 1}, overwrite=False, step=0)      # no "not empty" refusal
    assert (folder / "owner.json").is_file()


def test_two_data_generations_into_one_folder_never_interleave(tmp_path):
    """Two real `gemref data generate` processes on one folder: one writes, the other is refused
    (or, if the first finished already, writes after it): never both at once."""
    folder = tmp_path / "ds"
    cmd = [sys.executable, "-m", "gemref", "data", "generate", "--preset", "tiny", "--quiet", "--out", str(folder)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=Path(__file__).resolve().parents[1]) for _ in range(2)]
    deadline = time.monotonic() + 240
    results = [(p.wait(timeout=max(1, deadline - time.monotonic())), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    for code, err in results:
        if code == 2:
            assert err.count("\n") == 1 and f"--out {folder}: in use by another gemref process" in err
    assert main(["data", "check", str(folder)]) == 0      # the folder that is there is whole
