"""TorchRec interoperability: gemref's jagged batches as KeyedJaggedTensors, TorchRec as the sparse engine.

Importing this package never imports TorchRec: `lib.torchrec()` does, on first use, and a
missing or broken TorchRec is a one-line `UsageError`, so the native path never needs it.
  * `kjt.py`: JaggedBatch <-> KeyedJaggedTensor, lossless both ways;
  * `tables.py`: a GEMRef's tables as one EmbeddingCollection + one EmbeddingBagCollection
    (switch `embeddings="torchrec"`, TrainConfig.embedding_tables.engine, swapped in by train/compose.py from outside);
  * `sharders.py`: TorchRec's planner, CPU sharders, DistributedModelParallel over the ranks;
  * `example_model.py`: EXAMPLE ONLY, a small TorchRec ranker as a user would bring it, which
    gemref/mfu/foreign.py meters (chapter 13); nothing in gemref builds it.
"""
