"""MovieLens-100K: the converter on gemref's hand-written sample in the ML-100K atomic-file format
(checked row by row against a plain re-reading of the task's definition), on the real file when
it can be fetched, and every refusal (digest, bad wheel, no network, a destination in use):
one line, exit 2, nothing written.

The oracle (`expected_rows`) parses the sample with str.split and builds each row's history
with loops over sorted Python lists: it shares no code with gemref/data/movielens/.
"""
import hashlib
import os
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from gemref.cli import main
from gemref.data.movielens import convert, prepare
from gemref.data.movielens.atomic import ML100K, SAMPLE, SAMPLE_DIR, parse
from gemref.data.movielens.fetch import fetch_wheel
from gemref.errors import UsageError

GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western"]
CLOSED_PORT = "http://127.0.0.1:9/simple"    # the discard port: nothing listens, so pip cannot fetch


def lines(name: str) -> list[list[str]]:
    return [line.split("\t") for line in (SAMPLE_DIR / name).read_text().splitlines()[1:]]


def bucket(gap: int) -> int:
    return 0 if gap == 0 else min(25, gap.bit_length())       # 1 + floor(log2 gap), capped


def age_bucket(age: int) -> int:
    for i, top in enumerate((17, 24, 34, 44, 49, 55)):
        if age <= top:
            return i
    return 6


def expected_rows(max_history: int) -> dict[tuple[int, int], dict]:
    """(user id, movie id) -> the row the task defines (the converter's module doc), by hand."""
    users = {int(u[0]): u for u in lines("ml-100k.user")}
    items = {int(i[0]): i for i in lines("ml-100k.item")}
    occupations = sorted({u[3] for u in users.values()})
    by_user: dict[int, list] = {}
    for line_no, (u, i, r, t) in enumerate(lines("ml-100k.inter")):
        by_user.setdefault(int(u), []).append((int(t), line_no, int(i), int(r)))
    rows = {}
    for u, ratings in by_user.items():
        ratings.sort()
        n = len(ratings)
        held = max(1, int(0.1 * n))
        for j, (t, _, i, r) in enumerate(ratings):
            history = []
            for m in range(max(0, j - max_history), j):
                t_next = ratings[m + 1][0]
                history.append((ratings[m][2] - 1, ratings[m][3] - 1, bucket(t_next - ratings[m][0])))
            _, age, gender, occupation, zip_code = users[u]
            year, genres = items[i][2], items[i][3].split()
            decade = (int(year) - 1900) // 10 if year.isdigit() else 11
            region = int(zip_code[0]) if zip_code[0].isdigit() else 10
            rows[(u, i)] = {"split": "eval" if j >= n - held else "train", "history": history,
                            "sparse": [u - 1, age_bucket(int(age)), "MF".index(gender), occupations.index(occupation),
                                       region, decade],
                            "dense": [float(g in genres) for g in GENRES], "click": int(r >= 4), "conversion": int(r == 5)}
    return rows


def converted_rows(folder: Path) -> dict[tuple[int, int], dict]:
    out = {}
    for split in ("train", "eval"):
        for shard in sorted(folder.glob(f"{split}-*.parquet")):
            for row in pq.read_table(shard).to_pylist():
                key = (row["sparse_0"] + 1, row["ad_id"] + 1)
                assert key not in out, key
                out[key] = {"split": split, "history": list(zip(row["hist_item"], row["hist_action"], row["hist_time_gap"])),
                            "sparse": [row[f"sparse_{f}"] for f in range(6)], "dense": row["dense"],
                            "click": row["click"], "conversion": row["conversion"]}
    return out


def tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def one_line(capsys, code: int) -> str:
    err = capsys.readouterr().err
    lines_ = err.strip().splitlines()
    assert code == 2 and len(lines_) == 1 and "Traceback" not in err, err
    return lines_[0]


def test_the_sample_s_digests_are_pinned():
    for name, digest in SAMPLE.items():
        assert hashlib.sha256((SAMPLE_DIR / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("max_history", [3, 64])
def test_the_converter_builds_every_row_the_task_defines(tmp_path, max_history):
    manifest = convert(SAMPLE_DIR, tmp_path / "ml", max_history=max_history, sample=True)
    got, want = converted_rows(tmp_path / "ml"), expected_rows(max_history)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == want[key], key
    section = manifest["dataset"]
    assert section["max_len"] == max(len(r["history"]) for r in want.values())
    assert section["labels"]["click"] == {"name": "like", "means": "rating >= 4 stars"}
    assert section["conversion"]["ratings"] == len(lines("ml-100k.inter")) == len(want)
    assert "NOT MovieLens" in section["source"]["origin"]


def test_ties_are_broken_by_file_order_and_counted(tmp_path):
    manifest = convert(SAMPLE_DIR, tmp_path / "ml", max_history=64, sample=True)
    seen, tied = {}, 0
    for u, _, _, t in lines("ml-100k.inter"):
        tied += (u, t) in seen
        seen[(u, t)] = True
    assert manifest["dataset"]["conversion"]["same_second_as_an_earlier_rating"] == tied > 0


def test_training_on_the_converted_sample_runs(tmp_path, capsys):
    folder = tmp_path / "ml"
    assert main(["data", "movielens", "--sample", "--out", str(folder), "--max-history", "16"]) == 0
    assert "like_rate" in capsys.readouterr().out
    assert main(["train", "--dataset", str(folder), "--preset", "tiny", "--steps", "2", "--batch-size", "16",
                 "--jagged", "--kernel", "auto", "--quiet"]) == 0
    assert "ne/auc_click: like: rating >= 4 stars" in capsys.readouterr().out


def test_a_second_conversion_reuses_the_folder_without_writing(tmp_path):
    folder = tmp_path / "ml"
    convert(SAMPLE_DIR, folder, max_history=8, sample=True)
    before = tree(folder)
    convert(SAMPLE_DIR, folder, max_history=8, sample=True)
    assert tree(folder) == before


def test_a_changed_file_is_refused_by_its_digest_and_nothing_is_written(tmp_path, capsys):
    source = tmp_path / "src"
    source.mkdir()
    for name in SAMPLE:
        (source / name).write_bytes((SAMPLE_DIR / name).read_bytes())
    inter = source / "ml-100k.inter"
    inter.write_text(inter.read_text().replace("\t5\t", "\t4\t", 1))
    out = tmp_path / "out"
    line = one_line(capsys, main(["data", "movielens", "--wheel", str(source), "--out", str(out)]))
    assert "ml-100k.inter has sha256" in line and "nothing was written" in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b"not a zip"), "not a readable wheel"),
    (lambda p: zipfile.ZipFile(p, "w").writestr("recbole/__init__.py", ""), "the wheel has no recbole/dataset_example"),
    (lambda p: None, "no such file or folder"),
])
def test_a_bad_wheel_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, make, message):
    wheel = tmp_path / "recbole-1.2.1-py3-none-any.whl"
    make(wheel)
    out = tmp_path / "out"
    line = one_line(capsys, main(["data", "movielens", "--wheel", str(wheel), "--out", str(out)]))
    assert message in line and not out.exists()


def test_no_network_is_one_line_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GEMREF_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    line = one_line(capsys, main(["data", "movielens", "--index-url", CLOSED_PORT, "--out", str(out)]))
    assert "could not fetch recbole==1.2.1 with pip" in line and "--wheel PATH" in line
    assert not out.exists() and not list((tmp_path / "cache" / "movielens").iterdir())


def test_a_chapter_falls_back_to_the_sample_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMREF_CACHE_DIR", str(tmp_path / "cache"))
    said = []
    folder, is_sample = prepare(tmp_path / "ml", max_history=8, fallback_to_sample=True, index_url=CLOSED_PORT,
                                say=said.append)
    assert is_sample and (folder / "manifest.json").is_file()
    assert len(said) == 1 and "NOT MovieLens results" in said[0] and "could not fetch" in said[0]
    with pytest.raises(UsageError, match="could not fetch"):
        prepare(tmp_path / "ml2", max_history=8, index_url=CLOSED_PORT)


def test_a_destination_holding_something_else_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    line = one_line(capsys, main(["data", "movielens", "--sample", "--out", str(out)]))
    assert "holds another dataset" in line or "does not verify" in line
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert one_line(capsys, main(["data", "movielens", "--sample", "--wheel", "x"])).endswith("takes no --wheel")


@pytest.mark.parametrize("name, text, message", [
    ("ml-100k.inter", "user_id:token\titem_id:token\trating:float\n1\t2\t3\n", "header fields"),
    ("ml-100k.inter", "user_id:token\titem_id:token\trating:float\ttimestamp:float\n1\t2\t6\t5\n",
     "line 2: rating 6 is outside [1, 5]"),
    ("ml-100k.inter", "user_id:token\titem_id:token\trating:float\ttimestamp:float\n1\t2\t3.5\t5\n",
     "line 2: rating '3.5' is not an integer"),
    ("ml-100k.inter", "user_id:token\titem_id:token\trating:float\ttimestamp:float\n1\t2\t3\n", "line 2 has 3"),
    ("ml-100k.inter", "user_id:token\titem_id:token\trating:float\ttimestamp:float\n99\t1\t3\t5\n",
     "user_id 99 is not in ml-100k.user"),
    ("ml-100k.user", "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n1\t20\tX\tother\t1\n",
     "gender 'X'"),
    ("ml-100k.item", "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n1\tA\t1995\tCartoon\n",
     "genres 'Cartoon'"),
])
def test_every_line_is_checked(name, text, message):
    members = {n: (SAMPLE_DIR / n).read_bytes() for n in SAMPLE}
    members[name] = text.encode()
    with pytest.raises(UsageError) as e:
        parse(members, {})
    assert str(e.value).startswith(f"{name}: ") and message in str(e.value), str(e.value)


@pytest.fixture(scope="module")
def real_wheel():
    try:
        return fetch_wheel()
    except UsageError as e:
        pytest.skip(f"the recbole wheel cannot be fetched here: {e}")


@pytest.mark.slow
def test_the_real_file_converts_to_the_known_counts(real_wheel, tmp_path):
    with zipfile.ZipFile(real_wheel) as z:
        inter = z.read("recbole/dataset_example/ml-100k/ml-100k.inter")
    assert hashlib.sha256(inter).hexdigest() == ML100K["ml-100k.inter"]
    manifest = convert(real_wheel, tmp_path / "ml", max_history=256)
    rows = {s: sum(e["rows"] for e in v) for s, v in manifest["splits"].items()}
    facts = manifest["dataset"]["conversion"]
    assert rows == {"train": 90_404, "eval": 9_596}
    assert (facts["ratings"], facts["users"], facts["movies_rated"]) == (100_000, 943, 1_682)
    assert facts["same_second_as_an_earlier_rating"] == 50_561 and facts["empty_histories"] == 943
    assert (facts["shortest_user"], facts["longest_user"]) == (20, 737)
    likes = sum(int(line.split(b"\t")[2]) >= 4 for line in inter.splitlines()[1:])
    got = sum(np.sum(pq.read_table(tmp_path / "ml" / e["file"]).column("click").to_numpy())
              for v in manifest["splits"].values() for e in v)
    assert got == likes == 55_375
    assert "Harper" in manifest["dataset"]["source"]["citation"] and "redistribute" in manifest["dataset"]["source"]["licence"]


def test_gemref_s_own_default_folder_is_rebuilt_when_it_does_not_verify(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("GEMREF_DATA_DIR", str(tmp_path / "data"))
    folder, _ = prepare(sample=True, max_history=8)
    assert folder.parent == tmp_path / "data" and folder.name == "ml-100k-sample-v1-h8"
    shard = sorted(folder.glob("train-*.parquet"))[0]
    damaged = bytearray(shard.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    shard.write_bytes(bytes(damaged))
    (folder / ".verified.json").unlink()
    with caplog.at_level("WARNING", logger="gemref.data.movielens"):
        again, _ = prepare(sample=True, max_history=8)
    assert again == folder and "rebuilding" in caplog.text and "sha256" in caplog.text
    assert converted_rows(folder) == expected_rows(8)


def test_a_conversion_that_another_process_finished_first_reuses_its_folder(tmp_path, monkeypatch):
    """Two conversions into one folder at once (two chapters, two pytest workers): the one that
    renames second finds the folder filled after its own check, keeps the first one's result and
    leaves no temporary folder behind (it used to fail on removing the no longer empty folder)."""
    import gemref.data.movielens as ml

    folder = tmp_path / "ml"
    real, other = ml.write_manifest, []

    def first_the_other_process(tmp, listing, extra):
        if not other:
            other.append(True)
            convert(SAMPLE_DIR, folder, max_history=8, sample=True)       # the other process, done first
        return real(tmp, listing, extra)

    monkeypatch.setattr(ml, "write_manifest", first_the_other_process)
    manifest = convert(SAMPLE_DIR, folder, max_history=8, sample=True)
    assert manifest == ml.load_manifest(folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ml"]
