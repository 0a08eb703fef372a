"""Counts in messages agree with their nouns: "1 image", "1 error", "1 rank", never "1 images" or "rank(s)"."""

import ast
import re
from pathlib import Path

import pytest

from vggserve.wording import count, noun

PACKAGE = Path(__file__).resolve().parent.parent / "vggserve"
# nouns that follow a bare count in our messages; a count before one of them goes through `count`
COUNTED = ("images", "errors", "ranks", "devices", "workers", "candidates", "rows", "programs", "processes",
           "requests", "files", "layers", "chunks")
PLURAL_S = re.compile(r"[a-z]\(s\)")  # "device(s)"; "(s)" alone is a unit, seconds


@pytest.mark.parametrize("n, text", [(0, "0 images"), (1, "1 image"), (2, "2 images"), (1.0, "1.0 image")])
def test_count_uses_the_singular_for_exactly_one(n, text):
    assert count(n, "image") == text


def test_count_takes_an_irregular_plural_and_a_format():
    assert count(3, "decode process", "decode processes") == "3 decode processes"
    assert count(1, "decode process", "decode processes") == "1 decode process"
    assert count(12345, "image", spec=",") == "12,345 images" and noun(1, "rank") == "rank"


def test_the_batch_summary_of_one_image_one_error_and_one_rank_is_singular():
    """`vggserve batch` printed "batch: 1 images (0 classified, 1 errors) ... on 1 rank(s)"."""
    from vggserve.distributed.summary import format_summary, summarize

    ranks = [{"rank": 0, "device": "cpu", "device_name": "CPU"}]
    stats = {0: {"images": 1, "errors": 1, "active_seconds": 1.0, "images_per_second": 1.0}}
    first = format_summary(summarize(stats, ranks, wall=1.0, setup=0.5, skipped=0, output="r.jsonl",
                                     errors_file="e.jsonl")).splitlines()[0]
    assert first.startswith("batch: 1 image (0 classified, 1 error) in 1.00 s") and " on 1 rank;" in first


def test_messages_with_a_count_of_one_are_singular():
    from vggserve.serving.scheduling.errors import QueueFull

    assert "(1 image waiting or being decoded," in str(QueueFull(1))
    assert "(2 images waiting or being decoded," in str(QueueFull(2))


def _bare_counts(tree: ast.AST):
    """(line, text) of each f-string that puts a formatted value right before a COUNTED noun ("{n} images"),
    and of each string that writes a plural as "(s)". A value after "=" is a setting's name and value
    ("max_batch_size={n} images" of "1 to max_batch_size={n} images"), not a count."""
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            for before, value, after in zip([None] + parts[:-1], parts, parts[1:] + [None]):
                if not isinstance(value, ast.FormattedValue) or not isinstance(after, ast.Constant):
                    continue
                if isinstance(before, ast.Constant) and str(before.value).endswith("="):
                    continue
                words = str(after.value).split()
                if str(after.value).startswith(" ") and words and words[0].rstrip(",;.)") in COUNTED:
                    yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and PLURAL_S.search(node.value):
            yield node.lineno, node.value


def test_no_message_in_the_package_puts_a_bare_count_before_a_plural_noun():
    """The guard for "everywhere such counts are printed": a new "{n} images" fails here; use wording.count."""
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {text}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for line, text in _bare_counts(ast.parse(path.read_text(), str(path)))]
    assert found == []
