"""README.md and docs/*.md against the code: every `vggserve.*` module and name a code block uses exists; the
winograd doc's "by hand" snippet runs and writes what the text after it says (it imported `vggserve.model.winograd`
and `vggserve.runtime.tuning`, which do not exist); the README's Devices table lists every spec form `--device`
takes, and its Layout table names paths that exist and puts the autotuner where it is."""

import importlib
import json
import re
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
DOTTED = re.compile(r"(?<![\w/.-])vggserve(?:\.\w+)+")  # not deploy/vggserve.service
FROM_IMPORT = re.compile(r"^\s*from (vggserve(?:\.\w+)*) import (\([^)]*\)|[^\n#]+)", re.M)


def code_blocks(path: Path) -> list[str]:
    return FENCE.findall(path.read_text())


def named_in_code() -> set[str]:
    """Dotted names (`vggserve.a.b`, `vggserve.a.b.name`) that the docs' code blocks use or import."""
    names = set()
    for path in DOCS:
        for block in code_blocks(path):
            names.update(DOTTED.findall(block))
            for module, imported in FROM_IMPORT.findall(block):
                names.update(f"{module}.{name.split(' as ')[0].strip()}"
                             for name in imported.strip("()").replace("\n", " ").split(",") if name.strip())
    return names


def resolve(dotted: str):
    """The object a dotted name denotes: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if not ".".join(parts[:cut]).startswith(exc.name or "\0"):
                raise  # a module that exists but fails to import is not a stale doc: show it
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_docs_code_names_vggserve_modules_from_their_code_blocks():
    names = named_in_code()
    assert {"vggserve.VGG16", "vggserve.modelinput.raw_rgb", "vggserve.loadtest.standin"} <= names  # the scan works


@pytest.mark.parametrize("dotted", sorted(named_in_code()))
def test_every_vggserve_name_in_the_docs_code_exists(dotted):
    try:
        resolve(dotted)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{dotted}, named in a code block of README.md or docs/*.md, does not exist: {exc}")


def test_the_winograd_by_hand_snippet_stores_the_entries_the_text_names(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "winograd.md").read_text()
    after = text[text.index("Or by hand"):]
    snippet = FENCE.search(after).group(1)
    monkeypatch.setenv("VGGSERVE_CACHE_DIR", str(tmp_path))
    from vggserve.runtime import devices

    # no GPU here: the snippet's `devices.resolve("gpu")` answers with a GPU's name
    monkeypatch.setattr(devices, "resolve", lambda spec: types.SimpleNamespace(label="Some GPU (Some Platform)"))
    exec(compile(snippet, "docs/winograd.md", "exec"), {})
    stored = json.loads((tmp_path / "tuned.json").read_text())["Some GPU (Some Platform)"]
    (said_batch,) = re.findall(r'conv_by_batch\["(\d+)"\]', after.split("```")[2])
    entries = stored["conv_by_batch"][said_batch]
    assert set(entries) == {"256x512x28", "512x512x28", "512x512x14"}
    assert all(p["ALGO"] == "winograd" and p["WINO_M"] == 4 for p in entries.values())


def readme_table(heading: str) -> list[list[str]]:
    """The cells of the first table under `## heading` in README.md, header and rule left out."""
    section = (ROOT / "README.md").read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def test_readme_device_table_lists_every_spec_form_the_resolver_takes():
    """The table left out `cpu:N`, which `--device` takes (and names when it refuses a spec)."""
    from vggserve.runtime import devices
    from vggserve.runtime.devices import DeviceError

    with pytest.raises(DeviceError) as refused:
        devices.resolve("nonsense")
    taken = re.search(r"use (.*?) \(", str(refused.value)).group(1).replace(" or ", ", ").split(", ")
    listed = {spec for row in readme_table("Devices") for spec in re.findall(r"`([^`]+)`", row[0])}
    assert set(taken) <= listed, f"missing from README's Devices table: {set(taken) - listed}"


def test_readme_layout_puts_the_autotuner_where_it_is():
    """The Layout table said the autotuner was in vggserve/runtime/; it is vggserve/tuning.py."""
    import inspect

    from vggserve import tuning

    where = Path(inspect.getsourcefile(tuning.tune)).relative_to(ROOT).as_posix()
    layout = readme_table("Layout")
    for path, what in layout:
        for named in re.findall(r"`([^`]+)`", path):
            assert (ROOT / named).exists() or (ROOT / "vggserve" / named).exists(), named
    assert [path for path, what in layout if "autotuner" in what] == [f"`{where}`"]
