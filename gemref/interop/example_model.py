"""EXAMPLE ONLY: a small TorchRec ranking model written as a user would bring it, not gemref's model.

gemref/mfu/foreign.py meters it (chapter 13, tests/test_foreign_model.py); nothing in gemref
builds or trains it. A batch is `(kjt, dense, labels)`: the KeyedJaggedTensor of
`gemref.interop.kjt.batch_to_kjt` (keys item, action, time_gap, sparse_0.., ad), dense
(B, n_dense) float features, labels (B,) clicks in {0, 1}. The model:

    EmbeddingCollection      item, action -> (T, d) per history event (summed)
    EmbeddingBagCollection   sparse_f, ad  -> (B, d) each (pooled by SUM)
    sequence tower           qkv = Linear(d, 3d) on the T events, causal self-attention
                             (gemref.attention.gdpa on the KJT's values/offsets), x += Linear(d, d)
                             of it; kv = Linear(d, 2d) of x, the ad's q = Linear(d, d) attends over
                             its history (cross attention, one query per sample) -> (B, d)
    MLP head (`mix`)         [pooled, bags, dense] -> Linear(in, hidden) -> ReLU -> Linear(hidden, 1)

Forward matmul FLOPs (T events, B samples, F sparse features, H x D = d): linears
2T(3d^2 + d^2 + 2d^2) + 2B d^2 + 2B (in x hidden + hidden), in = (F + 2)d + n_dense; attention
4HD per allowed (query, key) pair, causal self-attention L(L+1)/2 pairs, cross attention L.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import gdpa
from ..data.jagged import JaggedBatch, lengths_to_offsets
from .kjt import AD_KEY, batch_to_kjt, sparse_keys
from .lib import torchrec


class ExampleRanker(nn.Module):
    """The module doc's model. `kernel`: gdpa's kernel ("auto", "cpu_fused", "cpu_jagged", ...)."""

    def __init__(self, *, vocab: int = 1000, n_sparse: int = 2, n_dense: int = 4, d: int = 32, heads: int = 2,
                 hidden: int = 64, kernel: str = "auto"):
        super().__init__()
        trec = torchrec()
        self.heads, self.kernel, self.n_sparse = heads, kernel, n_sparse
        self.ec = trec.EmbeddingCollection(tables=[
            trec.EmbeddingConfig(name=n, num_embeddings=vocab, embedding_dim=d, feature_names=[n])
            for n in ("item", "action")], device=torch.device("cpu"))
        self.ebc = trec.EmbeddingBagCollection(tables=[
            trec.EmbeddingBagConfig(name=n, num_embeddings=vocab, embedding_dim=d, feature_names=[n],
                                    pooling=trec.PoolingType.SUM)
            for n in sparse_keys(n_sparse) + (AD_KEY,)], device=torch.device("cpu"))
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.kv, self.ad_q = nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.head = nn.Sequential(nn.Linear((n_sparse + 2) * d + n_dense, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def tower(self, x: Tensor, ad: Tensor, offsets: Tensor) -> Tensor:
        """x (T, d) history events, ad (B, d), offsets (B+1,) -> (B, d): the ad's view of its history."""
        T, d = x.shape
        B, H = ad.shape[0], self.heads
        q, k, v = self.qkv(x).view(T, 3, H, d // H).unbind(1)
        x = x + self.out(gdpa(q, k, v, offsets, causal=True, kernel=self.kernel).reshape(T, d))
        k, v = self.kv(x).view(T, 2, H, d // H).unbind(1)
        ones = torch.arange(B + 1, dtype=offsets.dtype, device=offsets.device)
        q_ad = self.ad_q(ad).view(B, H, d // H)
        return gdpa(q_ad, k, v, ones, kv_offsets=offsets, kernel=self.kernel).reshape(B, d)

    def forward(self, kjt, dense: Tensor) -> Tensor:
        """The click logit (B,)."""
        trec = torchrec()
        per_key = kjt.to_dict()
        seq = self.ec(trec.KeyedJaggedTensor.from_jt_dict({n: per_key[n] for n in ("item", "action")}))
        bags = self.ebc(trec.KeyedJaggedTensor.from_jt_dict({n: per_key[n] for n in sparse_keys(self.n_sparse)
                                                             + (AD_KEY,)}))
        history = seq["item"]                        # a JaggedTensor: values (T, d), offsets (B+1,)
        x = history.values() + seq["action"].values()
        pooled = self.tower(x, bags[AD_KEY], history.offsets().to(torch.int64))
        return self.mix(pooled, bags.values(), dense)

    def mix(self, pooled: Tensor, bags: Tensor, dense: Tensor) -> Tensor:
        """The dense region: (B, d), (B, (F+1)d) pooled bags, (B, n_dense) -> the logit (B,)."""
        return self.head(torch.cat([pooled, bags, dense], dim=1)).squeeze(1)


def example_loss(model: ExampleRanker, batch) -> Tensor:
    """Binary cross-entropy of the click logit (mean over the batch)."""
    kjt, dense, labels = batch
    return F.binary_cross_entropy_with_logits(model(kjt, dense), labels)


def example_batch(lengths, *, vocab: int = 1000, n_sparse: int = 2, n_dense: int = 4, seed: int = 0):
    """(kjt, dense, labels) for histories of these lengths (random ids), through batch_to_kjt."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.as_tensor(lengths, dtype=torch.int64)
    B, T = lengths.numel(), int(lengths.sum())
    ids = lambda *shape: torch.randint(0, vocab, shape, generator=g)
    labels = torch.randint(0, 2, (B, 2), generator=g).float()
    batch = JaggedBatch(ids(T, 3), lengths_to_offsets(lengths), ids(B, n_sparse), torch.randn(B, n_dense, generator=g),
                        ids(B), labels)
    return batch_to_kjt(batch), batch.dense, labels[:, 0]


def example_lengths(batch) -> Tensor:
    """(B,) history lengths of an example batch: what `gemref.mfu.foreign.measure` asks for."""
    return batch[0].to_dict()["item"].lengths().to(torch.int64)
