"""The probe: finds sglang and its distributions in the interpreter under check without
importing sglang; its one line of JSON is checked key by key, since that interpreter may
be anything the operator points at.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset.errors import BackportError, Exit

# Runs in the inspected interpreter (Python 3.8 or later): finds sglang, and
# every distribution that installs files under sglang/ (by its RECORD, or an
# egg-info's installed-files.txt) or says it is sglang, whatever it is named
# (a fork such as sglang-kt installs the sglang package under another name),
# without importing sglang: find_spec of a top-level package does not run its
# __init__.
_PROBE = r"""
import json, os, posixpath, re, sys
sys.path[:] = [p for p in sys.path if p != ""]
import importlib.metadata as md
import importlib.util
out = {"python": sys.version.split()[0]}
spec = importlib.util.find_spec("sglang")
locations = list(spec.submodule_search_locations or []) if spec else []
out["package"] = locations[0] if locations else None
def listing(dist, info):
    # (what lists the files, [[path under the site folder, located, mode, hash]])
    if info and info.endswith(".egg-info"):
        text = dist.read_text("installed-files.txt")
        if text is not None:
            site = os.path.dirname(info)
            rows = []
            for line in text.splitlines():
                if line.strip():
                    located = os.path.normpath(os.path.join(info, line.strip()))
                    rows.append([os.path.relpath(located, site).replace(os.sep, "/"),
                                 located, None, None])
            return "installed-files.txt", rows
        return None, []
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
        "name": name,
        "version": dist.version or "unknown",
        "info": info,
        "listing": listed,
        "direct_url": dist.read_text("direct_url.json"),
        "hooks": [row[1] for row in rows
                  if "/" not in row[0] and row[0].endswith((".pth", ".py"))],
        "files": {row[0]: row[1:] for row in rows if row[0].startswith("sglang/srt/")},
    })
print(json.dumps(out))
"""

LISTINGS = ("RECORD", "installed-files.txt")


@dataclass(frozen=True)
class ProbedDist:
    """One installed distribution that installs the sglang package, as the inspected
    interpreter sees it."""

    name: str  # as its metadata spells it: sglang, or a fork's own name
    version: str
    info: str | None  # its .dist-info or .egg-info folder
    listing: str | None  # what lists its files: RECORD, installed-files.txt, or None
    direct_url: str | None  # the text of its direct_url.json (PEP 610)
    hooks: list[str]  # the .pth files and modules it installs at the top of site-packages
    files: dict[str, list[str | None]]  # sglang/srt/... -> [located path, hash mode, hash]

    @property
    def fork(self) -> bool:
        return _normalized(self.name) != "sglang"

    def describe(self) -> str:
        fork = "; a fork of sglang: not named sglang" if self.fork else ""
        return f"{self.name} {self.version} ({self.info or 'an unnamed place'}{fork})"


def _normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


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
        listing = _get(item, "listing", (str, type(None)), where)
        if listing is not None and listing not in LISTINGS:
            raise _BadAnswer(f"{where}['listing'] is {listing!r}, not one of {LISTINGS}")
        dists.append(
            ProbedDist(
                _get(item, "name", (str,), where),
                _get(item, "version", (str,), where),
                _get(item, "info", (str, type(None)), where),
                listing,
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
