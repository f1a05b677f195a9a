"""The pinned wheel with only the patched files, dist-info name, Version and RECORD changed."""

import base64
import csv
import hashlib
import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import apply, lint
from . import wheel as wheels
from .catalog import blobs_of
from .errors import BackportError, Exit
from .lock import deferred_signals, marked_folder
from .manifest import BASE_STEP, Series, sha256_of

BUILD_TEMP = (".build-wheel-", ".tmp")  # the marked folder's prefix and suffix in --out
NOT_PINNED = "this is not the wheel the manifest pins; delete it from the cache and run again"


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    sha256: str
    version: str
    changed: list[str]


def _metadata_with_version(data: bytes, old: str, new: str) -> bytes:
    """METADATA with its Version header changed; the rest byte for byte."""
    header, blank, rest = data.partition(b"\n\n")
    lines, line = header.split(b"\n"), f"Version: {old}".encode()
    if line not in lines:
        problem = f"the wheel's METADATA has no line {line.decode()!r}"
        raise BackportError(Exit.WHEEL_HASH, problem, NOT_PINNED)
    lines[lines.index(line)] = f"Version: {new}".encode()
    return b"\n".join(lines) + blank + rest


def _rewrite_record(
    data: bytes, rename: dict[str, str], changed: dict[str, bytes], record: str
) -> bytes:
    """RECORD with renamed paths, each changed member's new hash and size; other lines kept."""
    out = io.StringIO()
    for line in data.decode("utf-8").splitlines(keepends=True):
        path, *rest = next(csv.reader([line]))
        if path not in rename and path not in changed:
            out.write(line)
            continue
        new_path = rename.get(path, path)
        if new_path == record:
            rest = ["", ""]
        elif path in changed:
            digest = base64.urlsafe_b64encode(hashlib.sha256(changed[path]).digest())
            rest = [f"sha256={digest.rstrip(b'=').decode()}", str(len(changed[path]))]
        ending = line[len(line.rstrip("\r\n")) :]
        csv.writer(out, lineterminator=ending).writerow([new_path, *rest])
    return out.getvalue().encode("utf-8")


def build_wheel(series: Series, cache: Path, out_dir: Path, python: str | None) -> BuiltWheel:
    """The patched wheel for python (cp312; default the manifest's) in out_dir, reproducibly."""
    series.verify()
    manifest = series.manifest
    if problems := lint.label_problems(manifest):
        raise BackportError(
            Exit.PATCHSET_INVALID,
            f"{series.folder / 'pin.toml'}: " + "; ".join(problems),
            "fix the [build-wheel] table (scripts/lint-patches checks it) and run again",
        )
    base = manifest.base if python is None else manifest.release.wheels[python]
    source = wheels.fetch_wheel(base, cache)
    name, old_version, tags = base.wheel[: -len(".whl")].split("-", 2)
    version = f"{base.version}+{manifest.local_version}"
    old_info, new_info = f"{name}-{old_version}.dist-info/", f"{name}-{version}.dist-info/"
    base_files = dict(wheels.read_files(source, manifest.files))
    if blobs_of(base_files) != manifest.blobs_at(BASE_STEP):
        raise BackportError(
            Exit.BASE_MISMATCH,
            f"the files of {base.wheel} are not the base {series.folder.name} patches "
            f'([releases."{base.version}"] blobs in {manifest.registry.path})',
            "this wheel cannot be patched by this series: check its pin "
            f'([wheels."{base.version}"] or the default one) against the package index',
        )
    patched = apply.files_per_step(series, base_files)[manifest.final_step].items()
    changed = {p.removeprefix(wheels.REPO_PREFIX): d for p, d in patched if d != base_files[p]}
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}-{version}-{tags}.whl"
    with zipfile.ZipFile(source) as original:
        members = original.infolist()
        names = [m.filename for m in members]
        if f"{old_info}RECORD" not in names or f"{old_info}METADATA" not in names:
            problem = f"{source} has no {old_info}RECORD or METADATA"
            raise BackportError(Exit.WHEEL_HASH, problem, NOT_PINNED)
        rename = {n: new_info + n[len(old_info) :] for n in names if n.startswith(old_info)}
        changed[f"{old_info}METADATA"] = _metadata_with_version(
            original.read(f"{old_info}METADATA"), base.version, version
        )
        changed[f"{old_info}RECORD"] = _rewrite_record(
            original.read(f"{old_info}RECORD"), rename, changed, f"{new_info}RECORD"
        )
        # Written aside and renamed into place, so target is never half a wheel. The
        # file is made by open() (through zipfile), so its mode follows the umask. An
        # interrupt waits for the member being written: inside writestr it would leave
        # the archive with a member open, and closing it would fail in its place.
        with marked_folder(out_dir, *BUILD_TEMP) as tmp:
            with zipfile.ZipFile(tmp / target.name, "w") as rebuilt:
                for member in members:
                    if (data := changed.get(member.filename)) is None:
                        data = b"" if member.is_dir() else original.read(member)
                    with deferred_signals():
                        rebuilt.writestr(_copy_info(member, rename), data)
            os.replace(tmp / target.name, target)
    return BuiltWheel(target, sha256_of(target), version, [rename.get(m, m) for m in changed])


def _copy_info(member: zipfile.ZipInfo, rename: dict[str, str]) -> zipfile.ZipInfo:
    """The member's (renamed) ZipInfo, not the clock's or platform's: output from inputs alone."""
    info = zipfile.ZipInfo(rename.get(member.filename, member.filename), member.date_time)
    for name in ("compress_type", "external_attr", "create_system", "comment", "extra"):
        setattr(info, name, getattr(member, name))
    return info
