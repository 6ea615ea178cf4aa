"""Ctrl-C and SIGTERM end a long command cleanly: the real `gemref` command in a
subprocess, signalled mid-run, exits 130/143 with one line on stderr (no traceback, no leaked
semaphores), leaves no process it started alive (ranks, notebook kernels and theirs) and no
half-written output (gemref/runtime/interrupt.py, gemref/parallel/launch.py, gemref/cli.py,
gemref/walkthrough/batch.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gemref.runtime.interrupt import Interrupted, signals_raise

ROOT = Path(__file__).resolve().parents[1]
RANK = "spawn_main"        # in a spawned rank's command line


def _processes() -> dict[int, tuple[int, str, str]]:
    """{pid: (parent pid, state, command line)} of every process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out[int(entry.name)] = (int(stat[1]), stat[0], cmd)
            except (OSError, ValueError, IndexError):
                pass
    return out


def descendants(pid: int) -> dict[int, str]:
    """{pid: command line} of every living process below `pid`."""
    procs, found, grew = _processes(), {pid}, True
    while grew:
        new = {p for p, (parent, _, _) in procs.items() if parent in found} - found
        found |= new
        grew = bool(new)
    return {p: procs[p][2] for p in found - {pid}}


def alive(pids) -> list[int]:
    procs = _processes()
    return [p for p in pids if p in procs and procs[p][1] != "Z"]


def interrupt(args: list[str], sig: int, *, ranks: int, settle_s: float, group: bool = False, ready=None):
    """Start `gemref ARGS`, wait (bounded) until `ranks` spawned ranks run below it (or until
    `ready()` is true), `settle_s` more, then send `sig` to it (`group`: to its whole process group, as a terminal's Ctrl-C
    does). Returns (exit code, stderr lines, {pid: command} below it then, those still alive 15 s
    after it ended: killed, so a failing test leaves none running)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gemref", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (ready() if ready else sum(RANK in cmd for cmd in descendants(proc.pid).values()) >= ranks):
            assert proc.poll() is None, f"ended before it was interrupted: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "not ready within 180 s"
            time.sleep(0.2)
        time.sleep(settle_s)
        below = descendants(proc.pid)
        assert proc.poll() is None, f"ended before it was interrupted: {proc.stderr.read()}"
        (os.killpg if group else os.kill)(proc.pid, sig)
        _, err = proc.communicate(timeout=90)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)      # what is left of its session (nothing, when it works)
        except ProcessLookupError:
            pass
        proc.wait()
    deadline = time.monotonic() + 15         # the resource tracker leaves once its parent has gone
    while alive(below) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = {p: below[p] for p in alive(below)}
    for pid in survivors:                    # reported below; not left running on a failure
        os.kill(pid, signal.SIGKILL)
    return proc.returncode, err.splitlines(), below, survivors


def check_clean(code, lines, below, survivors, command: str, sig: int, children: int = 2) -> None:
    assert code == 128 + sig, lines
    assert lines == [f"gemref {command}: interrupted by {signal.Signals(sig).name}"], "\n".join(lines)
    assert len(below) >= children
    assert survivors == {}


def check_outputs(folder: Path) -> None:
    """Every file written is whole: no temporary or partial file left, every JSON parses."""
    for path in folder.rglob("*"):
        assert not path.name.endswith((".tmp", ".partial.ipynb")), path
        if path.suffix in (".json", ".ipynb"):
            json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_train_on_ranks_stops_cleanly(tmp_path, tiny_dataset, sig):
    out = tmp_path / "run.json"
    code, lines, below, survivors = interrupt(["train", "--preset", "tiny", "--ranks", "2", "--steps", "1000", "--quiet",
                                    "--json", str(out)], sig, ranks=2, settle_s=6)
    check_clean(code, lines, below, survivors, "train", sig)
    assert not out.exists()
    check_outputs(tmp_path)


@pytest.mark.slow
def test_ctrl_c_at_the_terminal_reaches_the_parent_only(tmp_path, tiny_dataset):
    """The whole foreground group gets SIGINT while the ranks still import: none of them prints."""
    code, lines, below, survivors = interrupt(["train", "--preset", "tiny", "--ranks", "2", "--steps", "1000", "--quiet"],
                                   signal.SIGINT, ranks=2, settle_s=0.5, group=True)
    check_clean(code, lines, below, survivors, "train", signal.SIGINT)


@pytest.mark.slow
def test_waterfall_on_ranks_stops_cleanly(tmp_path, tiny_dataset):
    out = tmp_path / "waterfall"
    code, lines, below, survivors = interrupt(["waterfall", "--preset", "tiny", "--ranks", "2", "--out", str(out),
                                    "--json", str(tmp_path / "waterfall.json")], signal.SIGINT, ranks=2, settle_s=4)
    check_clean(code, lines, below, survivors, "waterfall", signal.SIGINT)
    assert not (tmp_path / "waterfall.json").exists()
    check_outputs(tmp_path)


@pytest.mark.slow
def test_a_bench_on_ranks_stops_cleanly(tmp_path, tiny_dataset):
    code, lines, below, survivors = interrupt(
        ["bench", "balance", "--ranks", "2", "--batch", "32", "--preset", "tiny", "--measure",
         "--steps-per-policy", "1000", "--json", str(tmp_path / "bench.json")], signal.SIGTERM, ranks=2, settle_s=4)
    check_clean(code, lines, below, survivors, "bench balance", signal.SIGTERM)
    assert not (tmp_path / "bench.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("action, sig, executed", [("run", signal.SIGTERM, "nb"), ("build", signal.SIGINT, "nb/executed")])
def test_notebooks_kill_the_kernel_and_its_ranks(tmp_path, tiny_dataset, action, sig, executed):
    out = tmp_path / "nb"
    code, lines, below, survivors = interrupt(["notebooks", action, "07_fsdp_2d", "--out", str(out)], sig,
                                              ranks=2, settle_s=2)
    check_clean(code, lines, below, survivors, f"notebooks {action}", sig)
    assert any("ipykernel" in cmd for cmd in below.values())
    check_outputs(tmp_path)
    assert not (tmp_path / executed / "07_fsdp_2d.ipynb").exists()


@pytest.mark.slow
def test_an_interrupted_data_generation_leaves_no_dataset(tmp_path):
    out = tmp_path / "ds"
    code, lines, below, survivors = interrupt(
        ["data", "generate", "--preset", "tiny", "--set", "n_train=400000", "--quiet", "--out", str(out)],
        signal.SIGINT, ranks=0, settle_s=0.5, ready=lambda: any(out.glob("train-*.parquet")))
    check_clean(code, lines, below, survivors, "data generate", signal.SIGINT, children=0)
    assert sorted(p.name for p in out.iterdir()) == [".lock"]       # no shard, no manifest, no temporary file


def test_signals_raise_turns_sigterm_into_interrupted_once_and_restores_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as caught:
        with signals_raise():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert caught.value.exit_code == 143 and str(caught.value) == "interrupted by SIGTERM"
    assert isinstance(caught.value, KeyboardInterrupt)      # what `except Exception` must not swallow
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_resource_trackers_notice_on_killed_ranks_is_the_only_warning_turned_off(monkeypatch):
    """Killing the ranks on an interrupt leaves their semaphores to multiprocessing's resource
    tracker, which warned about them at exit (a flaky extra stderr line): the launcher adds one
    PYTHONWARNINGS entry for exactly that notice, once, keeping the user's own entries."""
    from gemref.parallel import launch

    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    launch._quiet_resource_tracker()
    launch._quiet_resource_tracker()
    assert os.environ["PYTHONWARNINGS"] == "error::DeprecationWarning,ignore:resource_tracker:UserWarning"
    monkeypatch.delenv("PYTHONWARNINGS")
    launch._quiet_resource_tracker()
    assert os.environ["PYTHONWARNINGS"] == "ignore:resource_tracker:UserWarning"


def test_a_sigterm_while_children_start_is_held_and_raised_once_after():
    """A process-directed SIGTERM reaches some thread that does not block it; it must still
    wait for the end of the start (gemref/parallel/launch.py binds its children first)."""
    from gemref.runtime.interrupt import starting_children

    reached_the_end = False
    with pytest.raises(Interrupted) as caught:
        with signals_raise():
            with starting_children():
                threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGTERM)).start()   # not the main thread
                time.sleep(0.5)
                reached_the_end = True
    assert reached_the_end and caught.value.exit_code == 143
