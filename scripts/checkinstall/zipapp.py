"""check-install as one file to copy into a pod (a zipapp).

The archive holds check-install's code and the release data it reads, and
nothing of the other commands; its bytes depend on those files alone.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

from patchset.manifest import RELEASES_NAME

# --- one file to copy into a pod ---------------------------------------------------

# The zipapp's entry: written in syntax every Python reads, so that launch.py can
# refuse an old one; it unpacks the archive into a folder of its own, runs
# check-install from there and removes the folder, also after Ctrl-C.
ZIPAPP_MAIN = '''\
"""check-install as one file: python3 check-install.pyz [--python PY] [--launch-args ARGS] ..."""
import os
import shutil
import sys
import tempfile
import zipfile


def main():
    archive = os.path.dirname(os.path.abspath(__file__))
    folder = tempfile.mkdtemp(prefix="check-install-")
    try:
        with zipfile.ZipFile(archive) as files:
            files.extractall(folder)
        sys.path.insert(0, os.path.join(folder, "scripts"))
        from launch import start

        start("check_install")
    except KeyboardInterrupt:
        sys.stderr.write("interrupted (SIGINT) while starting; nothing was changed\\n")
        sys.exit(130)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


main()
'''
# What check-install reads, relative to the project: its code and the release data.
ZIPAPP_FILES = (
    "scripts/launch.py",
    "scripts/commands/__init__.py",
    "scripts/commands/check_install.py",
    "scripts/checkinstall/*.py",
    "scripts/patchset/*.py",
    "scripts/racecheck/__init__.py",
    "scripts/racecheck/catalogue.py",
    f"patches/{RELEASES_NAME}",
    "patches/sglang-*/pin.toml",
    "patches/sglang-*/series",
)
ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def build_zipapp(project: Path, out: Path) -> str:
    """Write check-install as one zipapp to out; returns its sha256. Same files, same bytes."""
    members = sorted({path for pattern in ZIPAPP_FILES for path in project.glob(pattern)})
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buffer, "a", zipfile.ZIP_DEFLATED) as archive:
        for name, data in [
            ("__main__.py", ZIPAPP_MAIN.encode()),
            *((p.relative_to(project).as_posix(), p.read_bytes()) for p in members),
        ]:
            info = zipfile.ZipInfo(name, ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        partial.write_bytes(buffer.getvalue())
        partial.chmod(0o755)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return hashlib.sha256(buffer.getvalue()).hexdigest()
