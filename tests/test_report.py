"""Tables and atomic writes shared by every command."""
import os
import stat

from gemref.report import markdown_table
from gemref.runtime.files import write_json


def test_markdown_table_has_the_text_tables_cells():
    md = markdown_table([{"rung": "0 baseline", "mfu": 0.01234, "note": "a|b"}], ["rung", "mfu", "note"])
    assert md.splitlines() == ["| rung | mfu | note |", "|---|---:|---:|", "| 0 baseline | 0.0123 | a\\|b |"]


def test_written_records_are_readable_like_any_file(tmp_path):
    umask = os.umask(0o022)
    try:
        path = write_json(tmp_path / "r.json", {"a": 1})
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert path.read_text() == '{\n  "a": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]       # no temp file left behind
