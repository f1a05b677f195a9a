"""What an environment's sglang is: its three files, hashed and named, and its RECORD.

inspect_install asks the interpreter under check where sglang lives (a probe
that does not import sglang) and judges the files against the catalog and the
installed distribution's RECORD; inspect_tree does the same for a folder.
Standard library only: check-install runs in a pod with nothing installed.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchset.catalog import REPO_PREFIX, Catalog, KnownContent
from patchset.errors import BackportError, Exit
from patchset.manifest import git_blob_id


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
        location = package / path.removeprefix(f"{REPO_PREFIX}sglang/")
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
        entry = dist.files.get(state.path.removeprefix(REPO_PREFIX))
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
