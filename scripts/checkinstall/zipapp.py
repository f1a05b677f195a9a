"""check-install, the patchset modules it imports and the release data as one reproducible
zipapp for a pod, run from the archive (zipimport, zipfile.Path): nothing need be writable."""

import hashlib
import io
import os
import stat
import sys
import zipfile
import zipimport
from modulefinder import ModuleFinder
from pathlib import Path

from patchset import paths
from patchset.errors import BackportError, Exit
from patchset.manifest import MANIFEST_NAME, RELEASES_NAME, SERIES_NAME

# The zipapp's entry, in syntax every Python reads so that launch.py can refuse an old one;
# the archive's scripts/ goes on sys.path as it is (zipimport: nothing written anywhere).
ZIPAPP_MAIN = '''\
"""check-install as one file: python3 check-install.pyz [--python PY] [--launch-args ARGS] ..."""
import os
import sys

try:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
    from launch import start
except KeyboardInterrupt:
    sys.stderr.write("interrupted (SIGINT) while starting; nothing was changed\\n")
    sys.exit(130)
start("check_install")
'''
# check-install's own code (build_zipapp adds the patchset modules it imports) and data
CODE = ("scripts/launch.py", "scripts/commands/__init__.py", "scripts/commands/check_install.py")
CODE += ("scripts/checkinstall/*.py",)
DATA = (f"patches/{RELEASES_NAME}", f"patches/sglang-*/{MANIFEST_NAME}")
DATA += (f"patches/sglang-*/{SERIES_NAME}",)


def build_zipapp() -> bytes:
    """CODE, the patchset modules it imports (in turn) and DATA: same files, same bytes."""
    project, buffer = paths.PROJECT_ROOT, io.BytesIO(b"#!/usr/bin/env python3\n")
    code = {path for pattern in CODE for path in project.glob(pattern)}
    finder = ModuleFinder(path=[str(project / "scripts")])  # ours only: the stdlib is not read
    for source in sorted(code):
        finder.run_script(str(source))
    found = [m.__file__ for name, m in finder.modules.items() if name.split(".")[0] == "patchset"]
    kept = {path for pattern in DATA for path in project.glob(pattern)}
    files = sorted({*code, *(Path(f) for f in found if f), *kept})
    with zipfile.ZipFile(buffer, "a", zipfile.ZIP_DEFLATED) as archive:
        entries = [("__main__.py", ZIPAPP_MAIN.encode())]
        entries += [(p.relative_to(project).as_posix(), p.read_bytes()) for p in files]
        for name, data in entries:
            info = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            archive.writestr(info, data, zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


def write_zipapp(out: Path | None) -> str:
    """The zipapp to out (None: stdout), and what was done; a symlink, device or folder refused."""
    data = build_zipapp()
    digest = hashlib.sha256(data).hexdigest()
    done = f"(sha256 {digest}); run it as python3 {out.name if out else 'check-install.pyz'}"
    if out is None:
        if sys.stdout.isatty():
            raise BackportError(
                Exit.ENVIRONMENT,
                "--zipapp -: standard output is a terminal, not a file or a pipe",
                "redirect it: check-install --zipapp - > check-install.pyz, or pipe it, "
                "e.g. into kubectl exec -i POD -- sh -c 'cat > /tmp/check-install.pyz'",
            )
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return f"wrote the zipapp to standard output {done}"
    mode = out.lstat().st_mode if os.path.lexists(out) else stat.S_IFREG  # a new file
    what, name = "not a regular file (a device, a pipe or a socket)", "a regular file"
    if stat.S_ISLNK(mode):
        what, name = f"a symbolic link (to {os.readlink(out)})", "the file itself"
    next_step = f"name {name}, or use --zipapp - to write to standard output"
    if stat.S_ISDIR(mode):
        what, next_step = "a folder", f"name a file in it, e.g. --zipapp {out}/check-install.pyz"
    if not stat.S_ISREG(mode):
        problem = f"--zipapp {out}: {what}; nothing was written"
        raise BackportError(Exit.ENVIRONMENT, problem, next_step)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        partial.write_bytes(data)
        partial.chmod(0o755)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return f"wrote {out} {done}"


def data_root() -> Path | zipfile.Path:
    """Where patches/ is: inside the zipapp when this module was imported from it."""
    loader = __spec__.loader if __spec__ else None
    if isinstance(loader, zipimport.zipimporter):
        return zipfile.Path(loader.archive, "patches/")
    return paths.PATCHES_ROOT
