"""What the tests of scripts/build-wheel check in every patched wheel, and the
CPython interpreters they install the wheels into."""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import re
import zipfile
from pathlib import Path

import pytest
from patchset.manifest import Series, git_blob_id

# pyenv's interpreters: nothing on this machine can download one, so the tests
# look for them there.
PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def interpreter(version: str) -> Path:
    """The newest CPython X.Y under pyenv's versions. A machine without it fails
    the test: every Python sglang ships a wheel for must be tried."""
    found = [
        path
        for path in PYENV_VERSIONS.glob(f"{version}.*/bin/python{version}")
        if re.fullmatch(rf"{re.escape(version)}\.\d+", path.parent.parent.name)
    ]
    if not found:
        pytest.fail(
            f"no CPython {version} under {PYENV_VERSIONS} (found: "
            f"{', '.join(sorted(p.name for p in PYENV_VERSIONS.glob('*'))) or 'nothing'}); "
            f"install it there (pyenv install {version}), or set PYENV_ROOT"
        )
    return max(found, key=lambda p: [int(n) for n in p.parent.parent.name.split(".")])


def version_of(tag: str) -> str:
    """cp312 -> 3.12."""
    return f"3.{tag[3:]}"


def assert_only_patched_differ(built: Path, original: Path, series: Series) -> None:
    """built is original with the series applied: the same members in the same order,
    dates, modes and compression; only the changed sources, METADATA's Version line,
    the dist-info folder's name and RECORD differ."""
    base = series.manifest.base.version
    local = f"{base}+{series.manifest.local_version}"
    old_info, new_info = f"sglang-{base}.dist-info/", f"sglang-{local}.dist-info/"
    with zipfile.ZipFile(original) as old, zipfile.ZipFile(built) as new:
        old_infos, new_infos = old.infolist(), new.infolist()
        assert [i.filename.replace(old_info, new_info) for i in old_infos] == [
            i.filename for i in new_infos
        ]
        differ = []
        for a, b in zip(old_infos, new_infos, strict=True):
            assert (a.date_time, a.compress_type, a.external_attr) == (
                b.date_time,
                b.compress_type,
                b.external_attr,
            ), a.filename
            if old.read(a) != new.read(b):
                differ.append(b.filename)
        final = series.manifest.blobs_at(series.manifest.final_step)
        patched = {p.removeprefix("python/") for p in final}
        for member in patched:
            assert git_blob_id(new.read(member)) == final[f"python/{member}"]
        changed_sources = {m for m in patched if new.read(m) != old.read(m)}
        assert sorted(differ) == sorted(
            [*changed_sources, new_info + "METADATA", new_info + "RECORD"]
        )
        old_meta = old.read(old_info + "METADATA").decode().splitlines()
        new_meta = new.read(new_info + "METADATA").decode().splitlines()
        assert [(a, b) for a, b in zip(old_meta, new_meta, strict=True) if a != b] == [
            (f"Version: {base}", f"Version: {local}")
        ]
        # sglang's own __version__ stays the base's
        assert new.read("sglang/version.py") == old.read("sglang/version.py")


def assert_record_right(built: Path) -> None:
    """RECORD names every file of the wheel once, in order, each with its sha256 and
    size as PEP 376 writes them (RECORD itself without)."""
    with zipfile.ZipFile(built) as wheel:
        (record,) = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
        rows = list(csv.reader(wheel.read(record).decode().splitlines()))
        files = [i.filename for i in wheel.infolist() if not i.is_dir()]
        assert [row[0] for row in rows] == files
        for path, digest, size in rows:
            if path == record:
                assert (digest, size) == ("", ""), path
                continue
            data = wheel.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert (digest, size) == (f"sha256={expected.decode()}", str(len(data))), path
