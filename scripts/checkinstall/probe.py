"""The probe: finds sglang and its distributions in the interpreter under check without
importing it; its one line of JSON is checked key by key: that interpreter may be anything.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset.errors import BackportError, Exit

# Runs in the inspected interpreter (Python 3.8+): sglang, found by find_spec (which does
# not run its __init__), and every distribution that installs files under sglang/ (RECORD,
# installed-files.txt) or says it is sglang, whatever its name (a fork: sglang-kt).
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
    """One distribution that installs the sglang package, as the inspected interpreter sees it."""

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

    def describe(self) -> str:
        fork = "; a fork of sglang: not named sglang" if self.fork else ""
        return f"{self.name} {self.version} ({self.info or 'an unnamed place'}{fork})"


@dataclass(frozen=True)
class Probe:
    python: str
    package: str | None
    dists: list[ProbedDist]


_TEXT = (str, type(None))
# each key of a probed distribution and the JSON types it may hold
_DIST_KINDS = {"hooks": (list,), "files": (dict,), "listing": _TEXT, "name": (str,)}
_DIST_KINDS |= {"version": (str,), "info": _TEXT, "direct_url": _TEXT}


class _BadAnswer(ValueError):
    """What is wrong with the inspected interpreter's answer."""


_JSON_NAMES = {dict: "an object", list: "an array", str: "a string", bool: "true or false"}
_JSON_NAMES |= {int: "a number", float: "a number", type(None): "null"}


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
    top, dists = "the answer", []
    for index, item in enumerate(_get(answer, "dists", (list,), top)):
        where = f"{top}'s dists[{index}]"
        dist: dict[str, Any] = {}
        for key, kinds in _DIST_KINDS.items():  # in this order, so the first fault is named
            value = dist[key] = _get(item, key, kinds, where)
            if key == "hooks" and any(type(hook) is not str for hook in value):
                raise _BadAnswer(f"{where}['hooks'] holds something that is not a string")
            for name, entry in value.items() if key == "files" else ():
                if not (
                    type(entry) is list
                    and len(entry) == 3
                    and type(entry[0]) is str
                    and all(type(part) in _TEXT for part in entry[1:])
                ):
                    raise _BadAnswer(f"{where}['files'][{name!r}] is not [path, hash mode, hash]")
            if key == "listing" and value is not None and value not in LISTINGS:
                raise _BadAnswer(f"{where}['listing'] is {value!r}, not one of {LISTINGS}")
        dists.append(ProbedDist(**dist))
    return Probe(_get(answer, "python", (str,), top), _get(answer, "package", _TEXT, top), dists)


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
