"""Deploy the series: a patched sglang wheel.

build_wheel rewrites the pinned wheel so that only the patched files, the
.dist-info folder name, METADATA's Version and RECORD change. What an
environment then runs is check-install's business (scripts/checkinstall/).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import wheel as wheels
from .apply import files_per_step
from .errors import BackportError, Exit
from .lint import label_problems
from .manifest import (
    Series,
)

# build-wheel's temporary folder in --out: prefix and suffix (see wheel.marked_folder).
BUILD_TEMP = (".build-wheel-", ".tmp")


# --- build-wheel -------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    sha256: str
    version: str
    changed: list[str]


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def patched_files(series: Series, base_files: dict[str, bytes]) -> dict[str, bytes]:
    """The touched files after the whole series, checked against the manifest."""
    return files_per_step(series, base_files)[series.manifest.final_step]


def _metadata_with_version(data: bytes, old: str, new: str) -> bytes:
    """METADATA with its Version header changed; the rest byte for byte."""
    header_end = data.find(b"\n\n")
    header = data if header_end < 0 else data[:header_end]
    line = f"Version: {old}".encode()
    lines = header.split(b"\n")
    if line not in lines:
        raise BackportError(
            Exit.WHEEL_HASH,
            f"the wheel's METADATA has no line {line.decode()!r}",
            "this is not the wheel the manifest pins; delete it from the cache and run again",
        )
    lines[lines.index(line)] = f"Version: {new}".encode()
    return b"\n".join(lines) + (b"" if header_end < 0 else data[header_end:])


def _rewrite_record(
    data: bytes, rename: dict[str, str], changed: dict[str, bytes], record: str
) -> bytes:
    """RECORD with renamed paths and new hash and size for each changed member.

    Lines of members that did not change stay byte for byte.
    """
    out = []
    for line in data.decode("utf-8").splitlines(keepends=True):
        row = next(csv.reader([line]))
        path = row[0]
        if path not in rename and path not in changed:
            out.append(line)
            continue
        new_path = rename.get(path, path)
        if new_path == record:
            row = [new_path, "", ""]
        elif path in changed:
            content = changed[path]
            row = [new_path, _record_hash(content), str(len(content))]
        else:
            row = [new_path, *row[1:]]
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator=line[len(line.rstrip("\r\n")) :]).writerow(row)
        out.append(buffer.getvalue())
    return "".join(out).encode("utf-8")


def build_wheel(series: Series, cache: Path, out_dir: Path) -> BuiltWheel:
    """Write the patched wheel of series' release into out_dir; same inputs, same bytes."""
    series.verify()
    manifest = series.manifest
    problems = label_problems(manifest)
    if problems:
        raise BackportError(
            Exit.PATCHSET_INVALID,
            f"{series.folder / 'pin.toml'}: " + "; ".join(problems),
            "fix the [build-wheel] table (scripts/lint-patches checks it) and run again",
        )
    base = manifest.base
    source = wheels.fetch_wheel(base, cache)
    name, old_version, tags = base.wheel[: -len(".whl")].split("-", 2)
    version = f"{base.version}+{manifest.local_version}"
    old_info, new_info = f"{name}-{old_version}.dist-info/", f"{name}-{version}.dist-info/"
    record = f"{new_info}RECORD"

    base_files = dict(wheels.read_files(source, manifest.files))
    patched = patched_files(series, base_files)
    changed = {
        path.removeprefix(wheels.REPO_PREFIX): data
        for path, data in patched.items()
        if data != base_files[path]
    }

    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}-{version}-{tags}.whl"
    with zipfile.ZipFile(source) as original:
        members = original.infolist()
        names = [m.filename for m in members]
        if f"{old_info}RECORD" not in names or f"{old_info}METADATA" not in names:
            raise BackportError(
                Exit.WHEEL_HASH,
                f"{source} has no {old_info}RECORD or METADATA",
                "this is not the wheel the manifest pins; delete it from the cache and run again",
            )
        rename = {n: new_info + n[len(old_info) :] for n in names if n.startswith(old_info)}
        changed[f"{old_info}METADATA"] = _metadata_with_version(
            original.read(f"{old_info}METADATA"), base.version, version
        )
        changed[f"{old_info}RECORD"] = _rewrite_record(
            original.read(f"{old_info}RECORD"), rename, changed, record
        )
        # Written aside and renamed into place, so target is never half a wheel. The
        # file is made by open() (through zipfile), so its mode follows the umask.
        with wheels.marked_folder(out_dir, *BUILD_TEMP) as (tmp, _lock):
            with zipfile.ZipFile(tmp / target.name, "w") as rebuilt:
                for member in members:
                    data = changed.get(member.filename)
                    if data is None and not member.is_dir():
                        data = original.read(member)
                    rebuilt.writestr(_copy_info(member, rename), data or b"")
            os.replace(tmp / target.name, target)
    return BuiltWheel(
        target,
        hashlib.sha256(target.read_bytes()).hexdigest(),
        version,
        [rename.get(m, m) for m in changed],
    )


def _copy_info(member: zipfile.ZipInfo, rename: dict[str, str]) -> zipfile.ZipInfo:
    """A fresh ZipInfo with the member's name (renamed), date, mode and compression.

    Everything zipfile would otherwise take from the clock or the platform is
    set from the original, so the output depends on the inputs alone.
    """
    info = zipfile.ZipInfo(rename.get(member.filename, member.filename), member.date_time)
    info.compress_type = member.compress_type
    info.external_attr = member.external_attr
    info.create_system = member.create_system
    info.comment = member.comment
    info.extra = member.extra
    return info
