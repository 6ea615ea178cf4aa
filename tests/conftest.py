"""Shared fixtures: one generated tiny dataset for the whole session (all xdist workers).

Hypothesis profiles, chosen by the environment variable HYPOTHESIS_PROFILE:
  ci        (default) hypothesis' own 100 examples per property, unless a test asks for
            fewer; the CPU attention kernels take 1000 (gemref.attention.testing.CPU_KERNEL_EXAMPLES).
            Derandomized: the same draws on every run, so CI passes or fails on the code, not
            on the luck of the draw;
  thorough  at least 1000 examples for every property that does not fix its own count
            (`make test-kernels`: every kernel property, Triton under the interpreter too),
            with fresh random draws each run: the profile that explores. A case it finds
            that the bounds must cover is kept as an explicit `@example` of the property
            (e.g. GELU_TAIL_CASES in test_attention_kernels.py), so every ci run draws it too:
            `make test` runs the ci sample, the fixed draws plus those found cases.
No deadline in either (timings on a shared CI machine vary). The number of examples each
counted property ran is printed at the end of the session.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

from gemref.attention.testing import EXAMPLES

settings.register_profile("ci", deadline=None, print_blob=True, derandomize=True)
settings.register_profile("thorough", deadline=None, print_blob=True, max_examples=1000)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(PROFILE)

from gemref.train.presets import get_preset
from gemref.data.loader import EventDataset, make_loader
from gemref.data.shards import ensure_dataset, shard_paths


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> str:
    """A data root shared by xdist workers (generation is locked per folder)."""
    root = tmp_path_factory.getbasetemp().parent / "gemref-data"
    os.environ["GEMREF_DATA_DIR"] = str(root)
    return str(root)


@pytest.fixture(scope="session")
def tiny_dataset(data_root):
    from gemref.data.shards import dataset_dir

    preset = get_preset("tiny")
    folder = dataset_dir(preset.name, preset.model, preset.data, data_root)
    ensure_dataset(preset.model, preset.data, folder)
    return EventDataset(shard_paths(folder, "train")[:1], preset.model)


@pytest.fixture
def tiny_batch(tiny_dataset):
    return next(iter(make_loader(tiny_dataset, 16, seed=0)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _threads():
    """Every test leaves torch's thread count as it found it (a `gemref` command sets its own)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the examples a counted property ran to its report (reports cross xdist)."""
    outcome = yield
    if call.when == "call" and item.nodeid in EXAMPLES:
        outcome.get_result().user_properties.append(("hypothesis_examples", EXAMPLES.pop(item.nodeid)))


def pytest_terminal_summary(terminalreporter):
    """Print the examples each counted property ran; a test that ran properties in a pytest
    subprocess (Triton under the interpreter) attaches that run's rows as
    ("hypothesis_examples_subprocess", [(node id, examples, outcome), ...])."""
    rows = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":   # record_property's rows ride on teardown too
                continue
            for key, value in getattr(report, "user_properties", ()):
                if key == "hypothesis_examples":
                    rows.append((report.nodeid, report.outcome, value))
                elif key == "hypothesis_examples_subprocess":
                    rows += [(f"{node} (in {report.nodeid})", outcome, n) for node, n, outcome in value]
    rows.sort()
    if rows:
        terminalreporter.section(f"hypothesis examples run (profile {PROFILE})")
        for nodeid, outcome, n in rows:
            terminalreporter.write_line(f"{n:6d}  {nodeid} ({outcome})")
