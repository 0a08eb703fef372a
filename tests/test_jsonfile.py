"""jsonfile.write_json_atomically: whole files, the umask's mode, no temporary file left by a failed write."""

import json
import os

import pytest

from vggserve.jsonfile import write_json_atomically


def test_writes_indented_json_and_replaces_the_old_file(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("old")
    write_json_atomically(path, {"images": 3, "rates": [1.5, 2]})
    assert json.loads(path.read_text()) == {"images": 3, "rates": [1.5, 2]}
    assert path.read_text().endswith("}\n") and os.listdir(tmp_path) == ["summary.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text('{"old": true}\n')
    with pytest.raises(TypeError):
        write_json_atomically(path, {"not json": object()})
    assert json.loads(path.read_text()) == {"old": True} and os.listdir(tmp_path) == ["summary.json"]


def test_a_path_that_cannot_be_written_raises_and_leaves_nothing(tmp_path):
    path = tmp_path / "a-folder"
    path.mkdir()
    with pytest.raises(OSError):
        write_json_atomically(path, {"x": 1})
    assert os.listdir(tmp_path) == ["a-folder"] and os.listdir(path) == []


def test_the_file_gets_the_umasks_mode(tmp_path):
    old = os.umask(0o022)
    try:
        write_json_atomically(tmp_path / "s.json", [1])
    finally:
        os.umask(old)
    assert (tmp_path / "s.json").stat().st_mode & 0o777 == 0o644
