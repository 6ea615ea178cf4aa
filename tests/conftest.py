"""Shared fixtures: one generated tiny dataset for the whole session (all xdist workers)."""
from __future__ import annotations

import os

import pytest
import torch

from gemref.config import get_preset
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
    folder = dataset_dir(preset, data_root)
    ensure_dataset(preset.model, preset.data, folder)
    return EventDataset(shard_paths(folder, "train")[:1], preset.model)


@pytest.fixture
def tiny_batch(tiny_dataset):
    return next(iter(make_loader(tiny_dataset, 16, seed=0)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
