"""An environment's sglang: its three files hashed and named, and its RECORD, found by a probe
run in that interpreter (sglang not imported), its JSON checked key by key: it may be anything."""

import ast
import base64
import contextlib
import hashlib
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from patchset import shape
from patchset.catalog import REPO_PREFIX, Catalog, KnownContent
from patchset.errors import EXIT_TEXT, BackportError, Exit
from patchset.manifest import git_blob_id
from patchset.shapeflow import Sources

from checkinstall.launchargs import json_answer

JUDGED = "judged by code shape, not a known release"
# what each judgement's files carry, as releases.toml names the fixes
SHAPE_FIXES = {shape.AFFECTED: frozenset(), shape.FIX_A_ONLY: frozenset({"fix-a"})}
MATCHES = "matches RECORD"
# a file's RECORD state that says it was changed or added after its install
MODIFIED = ("differs from RECORD", "not in RECORD", "not in installed-files.txt")
NO_RECORD = "no RECORD: judged by content"
NO_DISTRIBUTION = "none: no installed distribution owns sglang/ or is named sglang (no RECORD)"
SHADOWED = "; it does not own the files found (another copy on sys.path shadows it)"

# Runs in the inspected interpreter (Python 3.8+): sglang, found by find_spec (which does
# not run its __init__), and every distribution that installs files under sglang/ (RECORD,
# installed-files.txt) or says it is sglang, whatever its name (a fork: sglang-kt).
_PROBE = r"""
import json, os, posixpath, re, sys
sys.path[:] = [p for p in sys.path if p != ""]
import importlib.metadata as md, importlib.util
out = {"python": sys.version.split()[0]}
spec = importlib.util.find_spec("sglang")
locations = list(spec.submodule_search_locations or []) if spec else []
out["package"] = locations[0] if locations else None
def listing(dist, info):
    # (what lists the files, [[path under the site folder, located, mode, hash]])
    if info and info.endswith(".egg-info"):
        text = dist.read_text("installed-files.txt")
        if text is None:
            return None, []
        site = os.path.dirname(info)
        located = [os.path.normpath(os.path.join(info, line.strip()))
                   for line in text.splitlines() if line.strip()]
        return "installed-files.txt", [[os.path.relpath(path, site).replace(os.sep, "/"),
                                        path, None, None] for path in located]
    if dist.read_text("RECORD") is None:
        return None, []
    return "RECORD", [[posixpath.normpath(f.as_posix()), str(dist.locate_file(f)),
                       f.hash.mode if f.hash else None, f.hash.value if f.hash else None]
                      for f in dist.files or []]
out["dists"], seen = [], set()
for dist in md.distributions():
    info = getattr(dist, "_path", None)
    info = os.path.realpath(str(info)) if info is not None else None
    if info in seen:
        continue
    try:
        name = dist.metadata.get("Name") or ""
    except Exception:
        name = ""
    listed, rows = listing(dist, info)
    top = (dist.read_text("top_level.txt") or "").split()
    owns = any(row[0].split("/")[0] == "sglang" for row in rows)
    if not (owns or re.sub(r"[-_.]+", "-", name).lower() == "sglang" or "sglang" in top):
        continue
    seen.add(info)
    out["dists"].append({
        "name": name, "version": dist.version or "unknown", "info": info, "listing": listed,
        "direct_url": dist.read_text("direct_url.json"),
        "hooks": [r[1] for r in rows if "/" not in r[0] and r[0].endswith((".pth", ".py"))],
        "files": {row[0]: row[1:] for row in rows if row[0].startswith("sglang/srt/")},
    })
print(json.dumps(out))
"""


class ProbedDist(NamedTuple):
    name: str  # as its metadata spells it: sglang, or a fork's own name
    version: str
    info: str | None  # its .dist-info or .egg-info folder
    listing: str | None  # what lists its files: RECORD, installed-files.txt, or None
    direct_url: str | None  # the text of its direct_url.json (PEP 610)
    hooks: list[str]  # the .pth files and modules it installs at the top of site-packages
    files: dict[str, list[str | None]]  # sglang/srt/... -> [located path, hash mode, hash]

    @property
    def fork(self) -> bool:
        return re.sub(r"[-_.]+", "-", self.name).lower() != "sglang"  # as PEP 503 compares

    @property
    def release(self) -> str:
        return self.version.split("+")[0]  # without our local label


# what the probe found: the Python version, sglang's folder (None: no sglang), its distributions
Probe = tuple[str, str | None, list[ProbedDist]]
_TEXT = (str, type(None))
# each key of a probed distribution and the JSON types it may hold
_DIST_KINDS = {"hooks": (list,), "files": (dict,), "listing": _TEXT, "name": (str,)}
_DIST_KINDS |= {"version": (str,), "info": _TEXT, "direct_url": _TEXT}
_JSON_NAMES = {dict: "an object", list: "an array", str: "a string", bool: "true or false"}
_JSON_NAMES |= {int: "a number", float: "a number", type(None): "null"}


def _get(obj: object, key: str, kinds: tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is {_JSON_NAMES[type(obj)]}, not an object")
    if key not in obj:
        raise ValueError(f"{where} has no {key!r}")
    value = obj[key]
    if type(value) not in kinds:
        wanted = " or ".join(_JSON_NAMES[kind] for kind in kinds)
        raise ValueError(f"{where}[{key!r}] is {_JSON_NAMES[type(value)]}, not {wanted}")
    return value


def _read_probe(text: str) -> Probe:
    """The probe's answer (one line of JSON), checked key by key and type by type (ValueError)."""
    try:
        answer = json_answer(text)
    except ValueError as err:
        raise ValueError(f"its answer is not JSON ({err})") from None
    top, dists = "the answer", []
    for index, item in enumerate(_get(answer, "dists", (list,), top)):
        where = f"{top}'s dists[{index}]"
        dist: dict[str, Any] = {}
        for key, kinds in _DIST_KINDS.items():  # in this order, so the first fault is named
            value = dist[key] = _get(item, key, kinds, where)
            if key == "hooks" and any(type(hook) is not str for hook in value):
                raise ValueError(f"{where}['hooks'] holds something that is not a string")
            for name, entry in value.items() if key == "files" else ():
                listed = type(entry) is list and len(entry) == 3 and type(entry[0]) is str
                if not (listed and all(type(part) in _TEXT for part in entry[1:])):
                    raise ValueError(f"{where}['files'][{name!r}] is not [path, hash mode, hash]")
            if key == "listing" and value not in (None, "RECORD", "installed-files.txt"):
                raise ValueError(
                    f"{where}['listing'] is {value!r}, not RECORD or installed-files.txt"
                )
        dists.append(ProbedDist(**dist))
    return _get(answer, "python", (str,), top), _get(answer, "package", _TEXT, top), dists


def ask(python: Path) -> Probe:
    """What python answers to the probe; refused (exit 16) with the reason if it cannot."""
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
            raise ValueError(f"exit status {result.returncode}")
        return _read_probe((result.stdout.strip().splitlines() or [""])[-1])
    except ValueError as err:
        said = result.stderr if result.returncode != 0 else result.stdout
        said = (said.strip().splitlines() or ["no output"])[-1]  # its last line, cut short
        said = said[:160] + "..." if len(said) > 160 else said
        raise BackportError(
            Exit.ENVIRONMENT,
            f"--python {python} is not a python this command can ask ({err}; it said: {said})",
            "pass a Python 3.8 or later interpreter",
        ) from None


@dataclass
class FileState:
    path: str  # python/sglang/... as in the manifests
    location: Path
    blob_id: str | None = None
    sha256: str | None = None
    record: str = "-"  # MATCHES, a MODIFIED state, NO_RECORD, ...; "-": none owns it

    @property
    def record_match(self) -> bool | None:
        return self.record == MATCHES if self.record in (MATCHES, *MODIFIED) else None


@dataclass
class InstallReport:
    where: str  # what was inspected, in words
    files: list[FileState]
    distribution: str = NO_DISTRIBUTION  # "sglang 0.5.15.post1 (...dist-info)", or why none
    matches: list[KnownContent] = field(default_factory=list)
    dist: ProbedDist | None = None  # the one distribution that installs sglang, if any
    python: str | None = None  # the inspected interpreter (None for --tree)
    python_version: str | None = None
    shape: "shape.Judgement | None" = None  # for files no blob id names
    judged_as: KnownContent | None = None  # with the shape's fixes: whose races are open

    @property
    def content(self) -> KnownContent | None:
        return self.matches[0] if self.matches else self.judged_as

    @property
    def settled_by_shape(self) -> bool:
        """Judged by shape as closed whatever the configuration (fixed, or not this design)."""
        return bool(self.shape) and self.shape.verdict in (shape.FIXED, shape.OTHER_DESIGN)

    @property
    def open(self) -> list[str] | None:
        """The races still open; None when the content is unknown."""
        if self.content is None:
            return [] if self.settled_by_shape else None
        return list(self.content.open)

    def verdict(self) -> tuple[Exit, str]:
        """Exit code and verdict: an open race first, then an edit pip does not know of."""
        open_, content, names = self.open, self.content, "; ".join(m.name for m in self.matches)
        if open_ and content:
            named = names or f"{JUDGED}: {self.shape.reason}; races as in {content.name}"
            if content.fixes:
                fixes = ", ".join(sorted(content.fixes))
                return Exit.PARTIAL_FIX, (
                    f"partial fix: {named} (has {fixes} only); races still open: {', '.join(open_)}"
                )
            return Exit.AFFECTED, f"affected: {named}; races open: {', '.join(open_)}"
        if any(f.record in MODIFIED for f in self.files):
            judged = f"{self.shape.verdict} ({JUDGED})" if self.shape else "unknown"
            return Exit.MODIFIED, (
                "modified: the files differ from the RECORD of the installed distribution "
                f"(an edit pip does not know of); content: {names or judged}"
            )
        if open_ is None or (self.shape and not self.matches and not self.settled_by_shape):
            why = f"; {JUDGED}: {self.shape.verdict}: {self.shape.reason}" if self.shape else ""
            return Exit.UNKNOWN_CONTENT, f"unknown content: {EXIT_TEXT[Exit.UNKNOWN_CONTENT]}{why}"
        if self.shape and not self.matches:
            return Exit.OK, f"{self.shape.verdict} ({JUDGED}): {self.shape.reason}; races closed"
        what = "patched" if self.matches[0].ours else "fixed upstream"
        return Exit.OK, f"{what}: {names}; races closed"


def _hash_files(package: Path, catalog: Catalog) -> list[FileState]:
    prefix = f"{REPO_PREFIX}sglang/"
    states = [FileState(path, package / path.removeprefix(prefix)) for path in catalog.files]
    for state in states:
        if state.location.is_file():
            data = state.location.read_bytes()
            state.blob_id, state.sha256 = git_blob_id(data), hashlib.sha256(data).hexdigest()
    return states


def _judge(report: InstallReport, catalog: Catalog, package: Path) -> InstallReport:
    blobs = {f.path: f.blob_id for f in report.files}
    report.matches = catalog.lookup(blobs) if all(blobs.values()) else []  # our steps first
    if report.matches:
        return report
    report.shape = shape.judge(Sources(package))
    if report.shape.verdict in SHAPE_FIXES:
        # the races open are those of known content with the same fixes: the release
        # the distribution names, else the one that shares most of the files
        version = report.dist.release if report.dist else ""
        hint = version if version in catalog.releases else catalog.nearest_release(blobs)
        report.judged_as = catalog.like(SHAPE_FIXES[report.shape.verdict], hint)
    return report


def inspect_tree(tree: Path, catalog: Catalog) -> InstallReport:
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
    return _judge(InstallReport(f"sglang tree {package}", files, "none (--tree)"), catalog, package)


def _finder_mapping(source: str) -> dict[str, str]:
    """The `MAPPING = {...}` literal of a setuptools editable finder, read, never run."""
    with contextlib.suppress(SyntaxError, ValueError, TypeError, AttributeError):  # not a dict
        for node in ast.parse(source).body:
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if [getattr(target, "id", None) for target in targets] == ["MAPPING"]:
                return {str(k): str(v) for k, v in ast.literal_eval(node.value).items()}
    return {}


def _check_record(report: InstallReport, dist: ProbedDist) -> None:
    if dist.listing is None:
        report.distribution += (
            "; it has no RECORD (as distribution and conda packages ship it), so the files "
            "are judged by their content alone"
        )
    for state in report.files:
        entry = dist.files.get(state.path.removeprefix(REPO_PREFIX))
        if dist.listing is None:
            state.record = NO_RECORD
        elif entry is None:
            state.record = f"not in {dist.listing}"
        elif Path(str(entry[0])).resolve() != state.location.resolve():
            state.record = "-"
        elif dist.listing != "RECORD":
            state.record = "in installed-files.txt (no hash): judged by content"
        else:
            digest = base64.urlsafe_b64encode(bytes.fromhex(state.sha256 or "")).rstrip(b"=")
            matches = state.sha256 and entry[1:] == ["sha256", digest.decode()]
            state.record = MATCHES if matches else "differs from RECORD"
    if all(s.record == "-" for s in report.files):  # it owns none of them
        report.distribution += SHADOWED


def _check_editable(report: InstallReport, dist: ProbedDist, url: str, package: Path) -> None:
    """An editable install's RECORD lists only its hooks: the files are judged by content where
    the hooks put sglang (PATH/sglang for a .pth file's path line, relative to its folder as
    site.py reads it, else a setuptools finder's MAPPING)."""
    packages: list[Path] = []
    for hook in map(Path, dist.hooks):
        try:
            text = hook.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if hook.suffix == ".pth":
            for line in text.splitlines():
                if line.strip() and not line.startswith(("#", "import ", "import\t")):
                    packages.append(hook.parent / line.rstrip() / "sglang")
        elif "sglang" in (mapping := _finder_mapping(text)):
            packages.append(Path(mapping["sglang"]))
    report.distribution += f", an editable install of {url}"
    if any(found.resolve() == package.resolve() for found in packages):
        report.distribution += f" (its hooks put sglang at {package}: judged by the files there)"
        for state in report.files:
            state.record = "editable: not in RECORD"
    elif packages:
        at = ", ".join(map(str, packages))
        report.distribution += f" whose hooks put sglang at {at}{SHADOWED}"
    else:
        hooks = ", ".join(Path(hook).name for hook in dist.hooks) or "none"
        report.distribution += (
            f"; its hooks ({hooks}) name no sglang folder this command can read, so it may "
            "not own the files found"
        )


def inspect_install(python: Path, catalog: Catalog) -> InstallReport:
    version, found, dists = ask(python)
    where = f"{python} (Python {version})"
    if not found:
        raise BackportError(
            Exit.NOT_INSTALLED,
            f"{where} finds no sglang package",
            "install sglang into that environment, or pass --python with the one that runs it",
        )
    if len(dists) > 1:
        named = "; ".join(f"{d.name} {d.version} at {d.info or 'an unnamed place'}" for d in dists)
        what = "that install the sglang package" if any(d.fork for d in dists) else "named sglang"
        pip = f"{shlex.quote(str(python))} -m pip uninstall --yes {dists[0].name}"
        raise BackportError(
            Exit.AMBIGUOUS,
            f"{where} has {len(dists)} distributions {what} on its path: {named}. Which one pip "
            "and importlib.metadata take depends on the order of sys.path, and each may have "
            "written some of the files, so the files cannot be judged against a RECORD",
            f"keep one of them: `{pip}` removes the first one named; pip leaves one outside "
            "the environment alone (on PYTHONPATH or in a .pth file's folder): take that "
            "folder off the path or delete it; then run again",
        )
    package = Path(found)
    report = InstallReport(f"sglang imported by {where}: {package}", _hash_files(package, catalog))
    report.python, report.python_version = str(python), version
    if dists:
        report.dist = dist = dists[0]
        fork = "; a fork of sglang: not named sglang" if dist.fork else ""
        report.distribution = (
            f"{dist.name} {dist.version} ({dist.info or 'an unnamed place'}{fork})"
        )
        url = None
        with contextlib.suppress(ValueError):
            url = json_answer(dist.direct_url or "null")
        info = url.get("dir_info") if isinstance(url, dict) else None
        if isinstance(info, dict) and info.get("editable") is True:  # PEP 660
            _check_editable(report, dist, str(url.get("url", "an unnamed folder")), package)
        else:
            _check_record(report, dist)
    return _judge(report, catalog, package)
