"""MovieLens ratings -> gemref's ads-event schema: one row per rating, its user's earlier ratings as the history.

The task, for each rating of user u on movie m at time t:
  * order: every user's ratings by (timestamp, then line in ml-100k.inter). About half the
    ratings share their second with an earlier rating of the same user; file order breaks
    those ties, so "earlier" is well defined (and the same on every run);
  * history: u's ratings before this one in that order, oldest first, the latest
    `max_history` kept; each event is (movie id - 1, stars - 1 as the action, time-gap
    bucket). An event's gap is the seconds to the user's next rating (for the last event of
    a history, to the rated one itself), bucketed log-spaced: 0 for the same second, then
    1 + floor(log2 gap), the last bucket open-ended (`TIME_BUCKETS`). A user's first rating
    has an empty history;
  * candidate: movie m (the ad_id column); labels: click = "like" (stars >= 4) and
    conversion = "five_stars" (stars == 5);
  * non-sequence features (sparse_0..5): user id - 1, age bucket (<18, 18-24, 25-34, 35-44,
    45-49, 50-55, 56+), gender, occupation, the zip code's first character (a digit, or a
    letter: outside the US), the movie's release decade (1900s..2000s, or unknown); dense:
    the movie's 19 genre flags (0/1);
  * split by time per user: each user's latest max(1, floor(10% of their ratings)) ratings
    are the eval rows, the rest train. Eval histories hold everything earlier, earlier eval
    ratings included (what a ranking model would see when serving);
  * rows of each split are shuffled with a fixed seed, so any prefix of a split is a random
    sample of it (gemref train evaluates the first eval batches).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...config.checks import at_least
from ...config.values import check_field_types
from ...errors import UsageError
from .atomic import GENRES, MovieLens

TIME_BUCKETS = 26           # gaps 0, [1, 2), [2, 4), ..., [2^23, 2^24), [2^24 s (194 days), inf)
AGE_EDGES = (18, 25, 35, 45, 50, 56)
AGE_NAMES = ("<18", "18-24", "25-34", "35-44", "45-49", "50-55", "56+")
DECADES = tuple(range(1900, 2010, 10))  # id = index; len(DECADES) = unknown year
EVAL_SHARE = 0.1
ROW_ORDER_SEED = 0
SPARSE_NAMES = ("user", "age_bucket", "gender", "occupation", "zip_region", "release_decade")
LABELS = {"click": ("like", "rating >= 4 stars"), "conversion": ("five_stars", "rating == 5 stars")}


def gap_bucket(gap: np.ndarray) -> np.ndarray:
    """Log-spaced bucket of gaps in seconds (module doc): 0 -> 0, g >= 1 -> min(1 + floor(log2 g), last)."""
    gap = np.asarray(gap, dtype=np.int64)
    if (gap < 0).any():
        raise ValueError("gaps must be >= 0 (events are in time order)")
    out = np.zeros(gap.shape, dtype=np.int64)
    pos = gap > 0
    out[pos] = np.minimum(1 + np.floor(np.log2(gap[pos].astype(np.float64))).astype(np.int64), TIME_BUCKETS - 1)
    return out


def canonical_order(ml: MovieLens) -> np.ndarray:
    """Indices of the ratings sorted by user, then timestamp, then line in the file."""
    return np.lexsort((np.arange(ml.user.size), ml.time, ml.user))


def release_decade(year: str) -> int:
    """The decade id of a release year's text; len(DECADES) (unknown) for a year that is not a number
    (ML-100K has "unkonwn" and "V"). A numeric year outside 1900..2009 is an error, never clamped."""
    if not year.isdigit():
        return len(DECADES)
    value = int(year)
    if not DECADES[0] <= value < DECADES[-1] + 10:
        raise ValueError(f"release year {value} is outside {DECADES[0]}..{DECADES[-1] + 9}")
    return (value - DECADES[0]) // 10


def user_features(ml: MovieLens) -> tuple[dict[int, list[int]], list[str]]:
    """{user id: [user, age bucket, gender, occupation, zip region]} ids, and the occupations in id order."""
    occupations = sorted({u[2] for u in ml.users.values()})
    out = {}
    for uid, (age, gender, occupation, zip_code) in ml.users.items():
        first = zip_code[0]
        region = int(first) if first.isdigit() else 10
        out[uid] = [uid - 1, int(np.searchsorted(AGE_EDGES, age, side="right")), ("M", "F").index(gender),
                    occupations.index(occupation), region]
    return out, occupations


@dataclass(frozen=True)
class DataSizes:
    """A DataShape (gemref/data/config.py) of its own: the data's half of a ModelConfig, for these files."""

    item_vocab: int
    action_vocab: int
    time_buckets: int
    sparse_vocab: tuple[int, ...]
    n_dense: int
    max_len: int

    def __post_init__(self) -> None:
        check_field_types(self)
        at_least(self, 1, "item_vocab", "action_vocab", "time_buckets", "n_dense", "max_len")
        if not self.sparse_vocab or min(self.sparse_vocab) < 1:
            raise UsageError(f"DataSizes.sparse_vocab needs >= 1 table of vocab >= 1, got {self.sparse_vocab}")

    @property
    def n_sparse(self) -> int:
        return len(self.sparse_vocab)


def data_sizes(ml: MovieLens, occupations: list[str], max_len: int) -> DataSizes:
    """The data half of a ModelConfig for these files: vocab sizes, feature counts, max_len."""
    return DataSizes(max_len=max(1, max_len), item_vocab=max(ml.items), action_vocab=5, time_buckets=TIME_BUCKETS,
                     sparse_vocab=(max(ml.users), len(AGE_NAMES), 2, len(occupations), 11, len(DECADES) + 1),
                     n_dense=len(GENRES))


def build_samples(ml: MovieLens, max_history: int) -> tuple[dict[str, dict], dict]:
    """{"train": samples, "eval": samples} in the columnar form gemref.data.schema.samples_to_table
    writes, and facts about the conversion (counts, ties, truncation) for the manifest."""
    order = canonical_order(ml)
    user, item, stars, time = ml.user[order], ml.item[order], ml.rating[order], ml.time[order]
    n = user.size
    first = np.flatnonzero(np.r_[True, user[1:] != user[:-1]])          # each user's first position
    counts = np.diff(np.r_[first, n])
    position = np.arange(n) - np.repeat(first, counts)                  # index within the user's ratings
    same_user_next = np.r_[user[1:] == user[:-1], False]
    gaps = np.where(same_user_next, np.r_[time[1:] - time[:-1], 0], 0)  # seconds to the user's next rating
    events = np.stack([item - 1, stars - 1, gap_bucket(gaps)], axis=1)
    lengths = np.minimum(position, max_history)
    held_out = np.maximum(1, np.floor(EVAL_SHARE * counts).astype(np.int64))
    is_eval = position >= np.repeat(counts - held_out, counts)

    features, occupations = user_features(ml)
    per_user = np.array([features[int(u)] for u in user], dtype=np.int64)
    decade = {i: release_decade(year) for i, (year, _) in ml.items.items()}
    genre_flags = {i: [float(g in genres) for g in GENRES] for i, (_, genres) in ml.items.items()}
    sparse = np.concatenate([per_user, np.array([[decade[int(i)]] for i in item], dtype=np.int64)], axis=1)
    dense = np.array([genre_flags[int(i)] for i in item], dtype=np.float32)

    rng = np.random.default_rng(ROW_ORDER_SEED)
    splits = {}
    for split, mask in (("train", ~is_eval), ("eval", is_eval)):
        rows = rng.permutation(np.flatnonzero(mask))
        row_lengths = lengths[rows]
        offsets = np.r_[0, np.cumsum(row_lengths)].astype(np.int64)
        starts = rows - row_lengths                                      # the history's first event
        token = np.arange(offsets[-1]) - np.repeat(offsets[:-1] - starts, row_lengths)
        hist = events[token]
        splits[split] = {"offsets": offsets, "items": hist[:, 0], "actions": hist[:, 1], "gaps": hist[:, 2],
                         "sparse": sparse[rows], "dense": dense[rows], "ad_ids": item[rows] - 1,
                         "click": (stars[rows] >= 4).astype(np.int8), "conversion": (stars[rows] == 5).astype(np.int8)}
    tied = int(((np.r_[False, time[1:] == time[:-1]]) & (position > 0)).sum())
    facts = {"ratings": int(n), "users": int(first.size), "movies_rated": int(np.unique(item).size),
             "same_second_as_an_earlier_rating": tied, "empty_histories": int((position == 0).sum()),
             "histories_cut_to_max_history": int((position > max_history).sum()),
             "longest_user": int(counts.max()), "shortest_user": int(counts.min()),
             "occupations": occupations, "age_buckets": list(AGE_NAMES),
             "release_decades": [f"{d}s" for d in DECADES] + ["unknown"], "genres": list(GENRES),
             "zip_region": "first character of the zip code: 0-9, or 10 for a letter (outside the US)",
             "max_len": int(lengths.max()) if n else 0}
    return splits, {**facts, "sizes": data_sizes(ml, occupations, int(lengths.max()) if n else 1)}
