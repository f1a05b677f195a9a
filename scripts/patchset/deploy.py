"""Deploy the series: a patched sglang wheel, and what an environment's sglang runs.

build_wheel rewrites the pinned wheel so that only the patched files, the
.dist-info folder name, METADATA's Version and RECORD change. inspect_install
and inspect_tree hash the three files an interpreter (or a folder) holds and
name their content from every manifest under patches/. Standard library only,
so check-install can be copied into a container and run by its python.
"""

from __future__ import annotations

import ast
import base64
import csv
import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import wheel as wheels
from .apply import files_per_step
from .errors import BackportError, Exit
from .manifest import (
    BASE_STEP,
    RELEASES_NAME,
    PinManifest,
    RaceEntry,
    Series,
    git_blob_id,
    load_releases,
    patch_set_folders,
)

BUILD_TABLE = "build-wheel"
# build-wheel's temporary folder in --out: prefix and suffix (see wheel.marked_folder).
BUILD_TEMP = (".build-wheel-", ".tmp")
# PEP 440 local version label, in its normalized form (lower case, dots), so
# that the file name, the folder name and METADATA spell it the same way.
LOCAL_LABEL = re.compile(r"^[a-z0-9]+(?:\.[a-z0-9]+)*$")

# --- the version label ---------------------------------------------------------


def series_sha256(manifest: PinManifest) -> str:
    """One hash of the whole series: sha256 over its 'name sha256' lines, in order."""
    lines = "".join(f"{name} {digest}\n" for name, digest in manifest.patch_hashes.items())
    return hashlib.sha256(lines.encode()).hexdigest()


def label_problems(manifest: PinManifest) -> list[str]:
    """What is wrong with the manifest's [build-wheel] table; empty when it is right."""
    table = manifest.raw.get(BUILD_TABLE)
    if not isinstance(table, dict):
        return [
            f'no [{BUILD_TABLE}] table: add one with local = "pdrace.N" and '
            f'series-sha256 = "{series_sha256(manifest)}"'
        ]
    problems = []
    local = table.get("local", "")
    if not isinstance(local, str) or not LOCAL_LABEL.match(local):
        problems.append(
            f"[{BUILD_TABLE}] local = {local!r} is not a PEP 440 local version label in "
            "normalized form (lower-case letters and digits, joined by dots, e.g. pdrace.2)"
        )
    pinned = table.get("series-sha256", "")
    actual = series_sha256(manifest)
    if pinned != actual:
        problems.append(
            f"[{BUILD_TABLE}] series-sha256 is {pinned!r}, but the series now hashes to "
            f"{actual}: the series changed, so give the wheel a new label (change local, "
            f'e.g. raise its number) and set series-sha256 = "{actual}"'
        )
    return problems


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


def build_wheel(
    series: Series, cache: Path, out_dir: Path, python: str | None = None
) -> BuiltWheel:
    """Write the patched wheel of series' release into out_dir; same inputs, same bytes.

    python: the CPython tag (cp312) of the pinned wheel to patch; default: the
    manifest's own wheel.
    """
    series.verify()
    manifest = series.manifest
    problems = label_problems(manifest)
    if problems:
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
    record = f"{new_info}RECORD"

    base_files = dict(wheels.read_files(source, manifest.files))
    if {path: git_blob_id(data) for path, data in base_files.items()} != manifest.blobs_at(
        BASE_STEP
    ):
        raise BackportError(
            Exit.BASE_MISMATCH,
            f"the files of {base.wheel} are not the base's that "
            f"{series.folder / 'pin.toml'} pins ([blobs] base)",
            "this wheel cannot be patched by this series; check its pin in [sglang.wheels]",
        )
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


# --- check-install -------------------------------------------------------------------


@dataclass(frozen=True)
class KnownContent:
    """One set of the three files this project can name."""

    name: str
    fixes: frozenset[str]  # upstream pull requests whose fix the files carry
    ours: bool  # made by one of our series (a step of it), not a release as shipped
    # the race checker's scenarios left open, from the [races] tables of the manifests
    open: tuple[str, ...] = ()
    # the release whose launch settings apply ([launch] of releases.toml)
    release: str = ""
    # every scenario's [races] entries at this content's step ([] clean)
    races: tuple[tuple[str, tuple[RaceEntry, ...]], ...] = ()


@dataclass
class Catalog:
    by_blobs: dict[tuple[tuple[str, str], ...], list[KnownContent]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    def add(self, blobs: dict[str, str], content: KnownContent) -> None:
        key = tuple(sorted(blobs.items()))
        entries = self.by_blobs.setdefault(key, [])
        if content not in entries:
            entries.append(content)

    def lookup(self, blobs: dict[str, str | None]) -> list[KnownContent]:
        return self.by_blobs.get(tuple(sorted(blobs.items())), [])  # type: ignore[arg-type]


def load_catalog(patches_root: Path) -> Catalog:
    """Every content the manifests under patches_root know: each step of each
    series, and each known release (patches/releases.toml), with the races each
    leaves open ([races]; a release not served here: those open at any step
    that holds the same fixes)."""
    folders = patch_set_folders(patches_root)
    if not folders:
        raise BackportError(
            Exit.PATCHSET_INVALID,
            f"no patch set (a folder with pin.toml) under {patches_root}",
            "run from a copy of the project that has its patches/ folder",
        )
    registry = load_releases(patches_root / RELEASES_NAME)
    all_series = [Series.load(folder, registry) for folder in folders]

    def prs(fixes: frozenset[str]) -> frozenset[str]:
        return frozenset(f"sgl-project/sglang#{registry.fixes[f].pr}" for f in fixes)

    catalog = Catalog(files=list(all_series[0].manifest.files))
    open_with: dict[frozenset[str], tuple[str, ...]] = {}
    races_with: dict[frozenset[str], tuple[tuple[str, tuple[RaceEntry, ...]], ...]] = {}
    for series in all_series:
        manifest = series.manifest
        if not manifest.races:
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"{series.folder / 'pin.toml'} has no [races] tables, so which races "
                "its steps leave open is not known",
                "write them from a run: scripts/race-check --write-expected",
            )
        served = ", ".join(manifest.releases)
        for index, step in enumerate(manifest.steps):
            if index == 0:
                name = f"unpatched sglang {served}"
            elif step == manifest.final_step:
                label = f"+{manifest.local_version}" if manifest.local_version else ""
                name = f"sglang {served} with the series {series.folder.name} applied {label}"
            else:
                name = f"sglang {served} with {series.folder.name} applied up to patch {step}"
            fixes, open_ = manifest.step_fixes[step], tuple(manifest.open_races(step))
            # a race open at any step with these fixes is open with them
            open_with[fixes] = tuple(dict.fromkeys(open_with.get(fixes, ()) + open_))
            races = tuple((scenario, by_step[step]) for scenario, by_step in manifest.races.items())
            races_with.setdefault(fixes, races)
            content = KnownContent(
                name.strip(), prs(fixes), index > 0, open_, manifest.base.version, races
            )
            catalog.add(manifest.blobs_at(step), content)
    # A served release is already named by its series' base step.
    served_releases = {r for series in all_series for r in series.manifest.releases}
    for release in registry.known.values():
        if release.version in served_releases:
            continue
        if release.fixes not in open_with:
            raise BackportError(
                Exit.PATCHSET_INVALID,
                f"{registry.path}: sglang {release.version} carries "
                f"{', '.join(sorted(release.fixes)) or 'no fix'}, and no step of a series "
                "here holds the same fixes, so which races it leaves open is not measured",
                "serve a release with those fixes (docs/maintaining.md), or correct its fixes",
            )
        content = KnownContent(
            f"sglang {release.version}",
            prs(release.fixes),
            False,
            open_with[release.fixes],
            release.version,
            races_with[release.fixes],
        )
        catalog.add(release.blobs, content)
    return catalog


@dataclass
class FileState:
    path: str  # python/sglang/... as in the manifests
    location: Path
    blob: str | None = None
    sha256: str | None = None
    # "matches RECORD", "differs from RECORD", "not in RECORD", "editable: not in RECORD"
    # (judged by content alone), or "-" (no distribution owns the file)
    record: str = "-"


@dataclass
class InstallReport:
    where: str  # what was inspected, in words
    files: list[FileState]
    distribution: str = ""  # "sglang 0.5.15.post1+pdrace.2 (.../sglang-...dist-info)" or why none
    matches: list[KnownContent] = field(default_factory=list)

    @property
    def modified(self) -> bool:
        return any(f.record in ("differs from RECORD", "not in RECORD") for f in self.files)

    @property
    def open(self) -> list[str] | None:
        """The races still open; None when the content is unknown."""
        if not self.matches:
            return None
        return list(self.matches[0].open)

    def verdict(self) -> tuple[Exit, str]:
        """The exit code and the verdict line.

        Precedence: an open race is named first (whether pip knows the files
        or not), then an edit pip does not know of, then unknown content.
        """
        open_ = self.open
        if open_:
            named = "; ".join(m.name for m in self.matches)
            if self.matches[0].fixes:
                fixes = ", ".join(sorted(self.matches[0].fixes))
                return Exit.PARTIAL_FIX, (
                    f"partial fix: {named} (has {fixes} only); races still open: {', '.join(open_)}"
                )
            return Exit.AFFECTED, f"affected: {named}; races open: {', '.join(open_)}"
        if self.modified:
            return Exit.MODIFIED, (
                "modified: the files differ from the RECORD of the installed distribution "
                f"(an edit pip does not know of); content: {self._content()}"
            )
        if open_ is None:
            return Exit.UNKNOWN_CONTENT, (
                "unknown content: the files match no release and no series this project knows"
            )
        match = self.matches[0]
        what = "patched" if match.ours else "fixed upstream"
        return Exit.OK, f"{what}: {'; '.join(m.name for m in self.matches)}; races closed"

    def _content(self) -> str:
        return "; ".join(m.name for m in self.matches) if self.matches else "unknown"


def _hash_files(package: Path, catalog: Catalog) -> list[FileState]:
    states = []
    for path in catalog.files:
        location = package / path.removeprefix(f"{wheels.REPO_PREFIX}sglang/")
        state = FileState(path, location)
        if location.is_file():
            data = location.read_bytes()
            state.blob = git_blob_id(data)
            state.sha256 = hashlib.sha256(data).hexdigest()
        states.append(state)
    return states


def _judge(report: InstallReport, catalog: Catalog) -> InstallReport:
    blobs = {f.path: f.blob for f in report.files}
    report.matches = catalog.lookup(blobs) if all(blobs.values()) else []
    # a step of our series is named before a release with the same files
    report.matches.sort(key=lambda m: not m.ours)
    return report


def inspect_tree(tree: Path, catalog: Catalog) -> InstallReport:
    """The three files of the sglang package in tree (tree/sglang or tree/python/sglang)."""
    for package in (tree / "sglang", tree / "python" / "sglang", tree):
        if (package / "srt").is_dir():
            break
    else:
        raise BackportError(
            Exit.NOT_INSTALLED,
            f"{tree} holds no sglang package (looked for sglang/srt and python/sglang/srt)",
            "pass --tree with the folder that holds sglang/ or python/sglang/",
        )
    files = _hash_files(package, catalog)
    return _judge(InstallReport(f"sglang tree {package}", files, "none (--tree)"), catalog)


# Runs in the inspected interpreter (Python 3.8 or later): finds sglang and
# every distribution named sglang without importing sglang. find_spec of a
# top-level package does not execute its __init__.
_PROBE = r"""
import json, os, sys
sys.path[:] = [p for p in sys.path if p != ""]
import importlib.metadata as md
import importlib.util
out = {"python": sys.version.split()[0]}
spec = importlib.util.find_spec("sglang")
locations = list(spec.submodule_search_locations or []) if spec else []
out["package"] = locations[0] if locations else None
out["dists"], seen = [], set()
for dist in md.distributions(name="sglang"):
    info = getattr(dist, "_path", None)
    info = os.path.realpath(str(info)) if info is not None else None
    if info in seen:
        continue
    seen.add(info)
    files = dist.files or []
    out["dists"].append({
        "version": dist.version or "unknown",
        "info": info,
        "direct_url": dist.read_text("direct_url.json"),
        "hooks": [str(dist.locate_file(f)) for f in files
                  if len(f.parts) == 1 and f.suffix in (".pth", ".py")],
        "files": {f.as_posix(): [str(dist.locate_file(f)),
                  f.hash.mode if f.hash else None, f.hash.value if f.hash else None]
                  for f in files if f.as_posix().startswith("sglang/srt/")},
    })
print(json.dumps(out))
"""


@dataclass(frozen=True)
class ProbedDist:
    """One installed distribution named sglang, as the inspected interpreter sees it."""

    version: str
    info: str | None  # its .dist-info folder
    direct_url: str | None  # the text of its direct_url.json (PEP 610)
    hooks: list[str]  # the .pth files and modules it installs at the top of site-packages
    files: dict[str, list[str | None]]  # sglang/srt/... -> [located path, hash mode, hash]


@dataclass(frozen=True)
class Probe:
    python: str
    package: str | None
    dists: list[ProbedDist]


class _BadAnswer(ValueError):
    """What is wrong with the inspected interpreter's answer."""


_JSON_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}


def _get(obj: object, key: str, kinds: tuple[type, ...], where: str) -> Any:
    """obj[key], which must be one of kinds; _BadAnswer says what is wrong."""
    if not isinstance(obj, dict):
        raise _BadAnswer(f"{where} is {_JSON_NAMES[type(obj)]}, not an object")
    if key not in obj:
        raise _BadAnswer(f"{where} has no {key!r}")
    value = obj[key]
    if type(value) not in kinds:
        wanted = " or ".join(_JSON_NAMES[kind] for kind in kinds)
        raise _BadAnswer(f"{where}[{key!r}] is {_JSON_NAMES[type(value)]}, not {wanted}")
    return value


def _read_probe(text: str) -> Probe:
    """The probe's answer (one line of JSON), checked key by key and type by type."""
    try:
        answer = json.loads(text)
    except ValueError as err:
        raise _BadAnswer(f"its answer is not JSON ({err})") from None
    top = "the answer"
    dists = []
    for index, item in enumerate(_get(answer, "dists", (list,), top)):
        where = f"{top}'s dists[{index}]"
        hooks = _get(item, "hooks", (list,), where)
        if any(type(hook) is not str for hook in hooks):
            raise _BadAnswer(f"{where}['hooks'] holds something that is not a string")
        files = _get(item, "files", (dict,), where)
        for name, entry in files.items():
            if not (
                type(entry) is list
                and len(entry) == 3
                and type(entry[0]) is str
                and all(type(value) in (str, type(None)) for value in entry[1:])
            ):
                raise _BadAnswer(f"{where}['files'][{name!r}] is not [path, hash mode, hash]")
        dists.append(
            ProbedDist(
                _get(item, "version", (str,), where),
                _get(item, "info", (str, type(None)), where),
                _get(item, "direct_url", (str, type(None)), where),
                hooks,
                files,
            )
        )
    return Probe(
        _get(answer, "python", (str,), top), _get(answer, "package", (str, type(None)), top), dists
    )


def _last_line(text: str, default: str) -> str:
    line = (text.strip().splitlines() or [default])[-1]
    return line[:160] + "..." if len(line) > 160 else line


def _probe(python: Path) -> Probe:
    if not python.exists():
        raise BackportError(
            Exit.ENVIRONMENT, f"--python {python}: no such file", "pass a python interpreter"
        )
    try:
        result = subprocess.run(
            [str(python), "-c", _PROBE], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BackportError(
            Exit.ENVIRONMENT,
            f"--python {python} could not be run: {err}",
            "pass a python interpreter that runs (e.g. the one in the environment's bin/)",
        ) from None
    try:
        if result.returncode != 0:
            raise _BadAnswer(f"exit status {result.returncode}")
        return _read_probe((result.stdout.strip().splitlines() or [""])[-1])
    except _BadAnswer as err:
        said = result.stderr if result.returncode != 0 else result.stdout
        raise BackportError(
            Exit.ENVIRONMENT,
            f"--python {python} is not a python this command can ask ({err}; it said: "
            f"{_last_line(said, 'no output')})",
            "pass a Python 3.8 or later interpreter",
        ) from None


def _editable_url(dist: ProbedDist) -> str | None:
    """The tree an editable install (PEP 660: dir_info.editable) serves; None if not one."""
    try:
        url = json.loads(dist.direct_url or "null")
    except ValueError:
        return None
    if not isinstance(url, dict):
        return None
    info = url.get("dir_info")
    if isinstance(info, dict) and info.get("editable") is True:
        return str(url.get("url", "an unnamed folder"))
    return None


def _finder_mapping(source: str) -> dict[str, str]:
    """The `MAPPING = {...}` literal of a setuptools editable finder, read, never run."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "MAPPING" and value is not None:
            try:
                mapping = ast.literal_eval(value)
            except ValueError:
                return {}
            return {str(k): str(v) for k, v in mapping.items()} if isinstance(mapping, dict) else {}
    return {}


def _hook_packages(hooks: list[str]) -> list[Path]:
    """Where an editable install's hooks put the sglang package.

    A .pth file's path lines go onto sys.path (relative ones from its folder,
    as site.py reads them), so sglang is PATH/sglang; a setuptools finder
    module maps the name to its folder in MAPPING.
    """
    found = []
    for hook in map(Path, hooks):
        try:
            text = hook.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if hook.suffix == ".pth":
            for line in text.splitlines():
                if line.strip() and not line.startswith(("#", "import ", "import\t")):
                    found.append(hook.parent / line.rstrip() / "sglang")
        elif "sglang" in (mapping := _finder_mapping(text)):
            found.append(Path(mapping["sglang"]))
    return found


SHADOWED = "; it does not own the files found (another copy on sys.path shadows it)"


def _check_record(report: InstallReport, dist: ProbedDist) -> None:
    """Each file against the RECORD of the distribution that installed it."""
    owned = 0
    for state in report.files:
        entry = dist.files.get(state.path.removeprefix(wheels.REPO_PREFIX))
        if entry is None:
            state.record = "not in RECORD"
            continue
        located, mode, value = entry
        if Path(str(located)).resolve() != state.location.resolve():
            state.record = "-"
            continue
        owned += 1
        if state.sha256 is None or mode != "sha256":
            state.record = "differs from RECORD"
            continue
        digest = base64.urlsafe_b64encode(bytes.fromhex(state.sha256)).rstrip(b"=").decode()
        state.record = "matches RECORD" if digest == value else "differs from RECORD"
    if not owned and all(s.record == "-" for s in report.files):
        report.distribution += SHADOWED


def _check_editable(report: InstallReport, dist: ProbedDist, url: str, package: Path) -> None:
    """An editable install: its RECORD lists only its hooks; the files are judged
    by their content, where the hooks say they live."""
    packages = _hook_packages(dist.hooks)
    report.distribution += f", an editable install of {url}"
    if any(found.resolve() == package.resolve() for found in packages):
        report.distribution += f" (its hooks put sglang at {package}: judged by the files there)"
        for state in report.files:
            state.record = "editable: not in RECORD"
    elif packages:
        report.distribution += (
            f" whose hooks put sglang at {', '.join(map(str, packages))}" + SHADOWED
        )
    else:
        hooks = ", ".join(Path(hook).name for hook in dist.hooks) or "none"
        report.distribution += (
            f"; its hooks ({hooks}) name no sglang folder this command can read, so it may "
            "not own the files found"
        )


def inspect_install(python: Path, catalog: Catalog) -> InstallReport:
    """The sglang that python would import: its three files, judged, and its RECORD."""
    probe = _probe(python)
    where = f"{python} (Python {probe.python})"
    if not probe.package:
        raise BackportError(
            Exit.NOT_INSTALLED,
            f"{where} finds no sglang package",
            "install sglang into that environment, or pass --python with the one that runs it",
        )
    if len(probe.dists) > 1:
        named = "; ".join(
            f"sglang {d.version} at {d.info or 'an unnamed place'}" for d in probe.dists
        )
        pip = f"{shlex.quote(str(python))} -m pip uninstall --yes sglang"
        raise BackportError(
            Exit.AMBIGUOUS,
            f"{where} has {len(probe.dists)} distributions named sglang on its path: {named}. "
            "Which one pip and importlib.metadata take depends on the order of sys.path, "
            "so the files cannot be judged against a RECORD",
            f"keep one of them: `{pip}` removes the first one named; pip leaves one outside "
            "the environment alone (on PYTHONPATH or in a .pth file's folder): take that "
            "folder off the path or delete it; then run again",
        )
    package = Path(probe.package)
    report = InstallReport(f"sglang imported by {where}: {package}", _hash_files(package, catalog))
    if not probe.dists:
        report.distribution = "none: no installed distribution named sglang (no RECORD)"
        return _judge(report, catalog)
    dist = probe.dists[0]
    report.distribution = f"sglang {dist.version} ({dist.info or 'an unnamed place'})"
    url = _editable_url(dist)
    if url is None:
        _check_record(report, dist)
    else:
        _check_editable(report, dist, url, package)
    return _judge(report, catalog)


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
