"""patchset/tomlread.py: the TOML reader check-install uses on Python 3.10 reads every data
file of the project as tomllib does, on 3.10 itself, and refuses what it does not understand."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
from conftest import SCRIPTS
from patchset import paths, tomlread

DATA = sorted(paths.PROJECT_ROOT.glob("patches/**/*.toml"))
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def test_the_data_files_are_there():
    assert paths.PATCHES_ROOT / "releases.toml" in DATA and len(DATA) >= 2


@pytest.mark.parametrize("path", DATA, ids=lambda p: str(p.relative_to(paths.PATCHES_ROOT)))
def test_every_data_file_reads_as_tomllib_reads_it(path: Path):
    text = path.read_text(encoding="utf-8")
    assert tomlread.subset_loads(text) == tomllib.loads(text)


def test_python_310_reads_them_with_the_subset_reader():
    found = sorted(PYENV.glob("3.10.*/bin/python"))
    if not found:
        pytest.fail(f"no Python 3.10 under {PYENV}: install it (pyenv install 3.10)")
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from patchset import tomlread; "
        "assert tomlread.loads is tomlread.subset_loads; "
        "print(json.dumps([tomlread.loads(open(p).read()) for p in sys.argv[2:]]))"
    )
    result = subprocess.run(
        [str(found[-1]), "-I", "-c", script, str(SCRIPTS), *map(str, DATA)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [tomllib.loads(p.read_text()) for p in DATA]


SUBSET = [
    ('a = 1\nb = "x" # c\n[t]\n"q.k" = { x = [1, 2,], y = true }\n', None),
    ('[a.b]\nc = -3\n[a."d"]\ne = [{}, { f = false }]\n', None),
    ('a = [\n  "x",  # one\n  "y",\n]\n', None),
    ('s = "tab\\there \\"q\\" \\\\"\n', None),
    # what the data files do not use is refused, not read
    ("c = 'lit'\n", "a value this reader does not know"),
    ("[[arr]]\nv = 1\n", "arrays of tables"),
    ("v = 1.5e3\n", "a value this reader does not know"),
    ('s = "\\u00e9"\n', "an escape this reader does not know"),
    ("a = { x = 1, }\n", "a key was expected"),
    ("a = 1\r\n", "after a value"),
    ('s = """multi\nline"""\n', "multi-line strings"),
    ("s = '''multi'''\n", "multi-line strings"),
    ("d = 1979-05-27\n", "a value this reader does not know"),
    ("h = 0xff\n", "a value this reader does not know"),
    ("i = inf\n", "a value this reader does not know"),
    ("a = 1\na = 2\n", "defined twice"),
    ("[t]\n[t]\n", "defined twice"),
    ('a = "x" b = 1\n', "after a value"),
    ('a = "unterminated\n', "line end inside a string"),
    ("a = [1 2]\n", "a comma or a ]"),
    ('a = "\\q"\n', "an escape this reader does not know"),
]


@pytest.mark.parametrize(("text", "refused"), SUBSET)
def test_the_subset_is_read_as_tomllib_reads_it_and_the_rest_refused(text: str, refused: str):
    if refused is None:
        assert tomlread.subset_loads(text) == tomllib.loads(text)
        return
    with pytest.raises(tomlread.SubsetDecodeError, match=refused):
        tomlread.subset_loads(text)
