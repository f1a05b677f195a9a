"""Lint one patch set folder: every rule adds to one report, so one run lists every problem;
a run that checked nothing fails, as a linter that checks nothing looks like one that passes."""

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BackportError
from .manifest import (
    BASE_STEP,
    MANIFEST_NAME,
    ON_BRANCH,
    PYTHONS,
    SERIES_NAME,
    WHEELS_TABLE,
    PinManifest,
    release_key,
    require_folder,
    series_entries,
    sha256_of,
    step_of,
)
from .patchfile import Patch, Trailer, line_naming, parse_patch, touched_paths

# Yocto's list; the patch set uses the word only, or the word and "[detail]".
UPSTREAM_STATUSES = ("Pending", "Submitted", "Denied", "Inappropriate", "Backport")
UPSTREAM_STATUSES += ("Inactive-Upstream",)
REQUIRED_TRAILERS = ("Upstream-Status", "Upstream-PR", "Upstream-Release")
STATUSES_WITHOUT_PR = ("Pending", "Inappropriate")

STATUS_VALUE = re.compile(r"^(?P<word>[A-Za-z-]+)(?: \[[^\]]+\])?$")
PR_VALUE = re.compile(r"^(?:[\w.-]+/[\w.-]+#\d+|https://github\.com/[\w.-]+/[\w.-]+/pull/\d+)$")
RELEASE_VALUE = re.compile(r"^\d+(?:\.\d+)+(?:\.post\d+)?$")

RULES = {
    "series": "series lists every patch file once, and only files that exist",
    "manifest": "pin.toml loads; its patch hashes, order and blob ids match (the base's: "
    "releases.toml's)",
    "allow-list": "patches touch only the files named in the manifest's [blobs]",
    "description": "every patch has a subject and a description of why",
    "trailers": "Upstream-Status, Upstream-PR and Upstream-Release, valid values; a "
    "Backport's PR and first release are releases.toml's for the fix its step adds",
    "whitespace": "no trailing whitespace on added lines",
    "final-newline": "every file of the patch set, and every patched file, ends with a newline",
    "line-endings": "every file of the patch set has LF line endings, byte for byte (no CR)",
    "build-wheel": "[build-wheel] local is a PEP 440 local label; series-sha256 is the series'",
    "wheels": "every release served pins its wheel for each Python sglang ships (cp310 to cp313)",
    "nothing-checked": "the run checked at least one patch with a diff",
}


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int | None
    rule: str
    message: str

    def render(self) -> str:
        path, here = self.path.resolve(), Path.cwd().resolve()
        shown = str(path.relative_to(here) if path.is_relative_to(here) else self.path)
        where = f"{shown}:{self.line}" if self.line else shown
        return f"{where}: [{self.rule}] {self.message}"


@dataclass
class LintReport:
    folder: Path
    violations: list[Violation] = field(default_factory=list)
    # what each rule looked at, so "nothing checked" can be told from "clean"
    checked: Counter[str] = field(default_factory=Counter)
    patches: list[str] = field(default_factory=list)

    def add(self, path: Path, line: int | None, rule: str, message: str) -> None:
        self.violations.append(Violation(path, line, rule, message))


def _read_series(report: LintReport, folder: Path) -> tuple[list[tuple[str, int]], list[Path]]:
    """The series' (name, line) entries, and the listed patches that exist, once each."""
    if not (series_file := folder / SERIES_NAME).is_file():
        report.add(series_file, None, "series", "the series file does not exist")
        return [], []
    entries = series_entries(series_file)
    seen: dict[str, int] = {}
    existing: list[Path] = []
    for name, number in entries:
        report.checked["series"] += 1
        if name in seen:
            problem = f"{name} is listed again (first on line {seen[name]}); list each patch once"
            report.add(series_file, number, "series", problem)
            continue
        seen[name] = number
        if "/" in name or not (folder / name).is_file():
            problem = f"{name} is listed but there is no such file in {folder.name}/"
            report.add(series_file, number, "series", problem)
        else:
            existing.append(folder / name)
    for path in sorted(folder.glob("*.patch")):
        report.checked["series"] += 1
        if path.name not in seen:
            problem = "this patch file is not listed in series; list it, or delete it"
            report.add(path, None, "series", problem)
    return entries, existing


def _check_manifest(
    report: LintReport, manifest: PinManifest, entries: list[tuple[str, int]]
) -> None:
    pin = report.folder / MANIFEST_NAME
    listed = [name for name, _ in entries]
    pinned = list(manifest.patch_hashes)
    for name, number in entries:
        if name not in manifest.patch_hashes:
            problem = f"{name} has no sha256 in {pin.name} [patches]; run scripts/export-patches"
            report.add(report.folder / SERIES_NAME, number, "manifest", problem)
    for name in pinned:
        if name not in listed:
            report.add(pin, None, "manifest", f"[patches] pins {name}, which series does not list")
    if [n for n in listed if n in pinned] != [n for n in pinned if n in listed]:
        problem = f"[patches] orders the patches {pinned}, series orders them {listed}"
        report.add(pin, None, "manifest", problem)
    for version in manifest.releases:  # the manifest has checked each pin's form already
        report.checked["wheels"] += 1
        pinned = manifest.for_release(version).release.wheels
        for tag in [tag for tag in PYTHONS if tag not in pinned]:
            problem = (
                f"sglang {version} pins no wheel for Python 3.{tag[3:]} "
                f'([{WHEELS_TABLE}."{version}"] {tag}): add its file name and sha256 as '
                "the package index lists them (https://pypi.org/simple/sglang/)"
            )
            report.add(pin, None, "wheels", problem)


def _check_pins(report: LintReport, manifest: PinManifest, patch: Patch) -> None:
    """What the manifest pins of a patch: its sha256; and of the step it brings the tree to: its
    index lines name the step's blobs, a file it does not touch keeps its blob, and a Backport's
    PR and release are those releases.toml gives the fix the step adds."""
    if (pinned := manifest.patch_hashes.get(patch.path.name)) is not None:
        report.checked["manifest"] += 1
        if (actual := sha256_of(patch.path)) != pinned:
            problem = f"sha256 is {actual}, but {MANIFEST_NAME} pins {pinned}; if the change is "
            report.add(patch.path, None, "manifest", f"{problem}wanted, {ON_BRANCH}")
    if (step := step_of(patch.path.name)) not in manifest.steps[1:]:
        return
    before = manifest.steps[manifest.steps.index(step) - 1]
    pins = {s: "[blobs] pins" for s in manifest.steps}
    pins[BASE_STEP] = f'{manifest.registry.path.name} [releases."{manifest.base.version}"] has'
    touched = {diff.path: diff for diff in patch.files}
    for path, by_step in manifest.blobs.items():
        diff = touched.get(path)
        report.checked["manifest"] += 1
        if diff is None and by_step[step] != by_step[before]:
            problem = f"does not touch {path}, but [blobs] pins {by_step[step]} at step {step}"
            problem += f" and {pins[before]} {by_step[before]} at step {before}"
            report.add(patch.path, None, "manifest", problem)
        if diff is None or diff.old_blob is None:
            continue
        for side, blob, at in (("pre", diff.old_blob, before), ("post", diff.new_blob, step)):
            if blob != (want := by_step[at]):
                problem = f"{path}: {side}-image blob {blob}, but {pins[at]} {want} at step {at}"
                report.add(patch.path, diff.index_line, "manifest", problem)
    status = patch.trailer("Upstream-Status")
    if not status or not status[0].value.startswith("Backport"):
        return
    registry = manifest.registry
    for name in sorted(manifest.step_fixes[step] - manifest.step_fixes[before]):
        report.checked["trailers"] += 1
        first = next((r for r, k in registry.known.items() if name in k.fixes), None)
        for key, value in (("Upstream-PR", registry.fixes[name].ref), ("Upstream-Release", first)):
            found = patch.trailer(key)
            if found and value is not None and found[0].value != value:
                problem = f"{key}: {found[0].value}, but {registry.path.name} says {name} "
                problem += f"(what step {step} adds, [step-fixes]) is {value}"
                report.add(patch.path, found[0].line, "trailers", problem)


def _check_allow_list(report: LintReport, manifest: PinManifest, patch: Patch) -> None:
    touched, problem = touched_paths(patch.path)
    report.checked["allow-list"] += 1
    if problem:
        report.add(patch.path, None, "allow-list", f"git cannot read this patch: {problem}")
    for path in dict.fromkeys(touched):
        if path not in manifest.blobs:
            problem = (
                f"touches {path}, which is not one of the files this series may change "
                f"({', '.join(sorted(manifest.blobs))}); add it to the manifest's [blobs] only if "
                "the fix really needs it"
            )
            report.add(patch.path, line_naming(patch, path), "allow-list", problem)


def _check_message(report: LintReport, patch: Patch, base_version: str | None) -> None:
    report.checked.update(("description", "trailers"))
    if not patch.subject:
        report.add(patch.path, 1, "description", "no Subject: header")
    if not patch.description:
        problem = "no description: say in the message body why the patch exists and when it can "
        problem += "be dropped"
        report.add(patch.path, patch.subject_line or 1, "description", problem)
    given: dict[str, Trailer] = {}
    for key in REQUIRED_TRAILERS:
        found = patch.trailer(key)
        if not found:
            problem = f"no {key}: trailer (put it in the last paragraph of the message)"
            report.add(patch.path, patch.subject_line or 1, "trailers", problem)
            continue
        for extra in found[1:]:
            report.add(patch.path, extra.line, "trailers", f"{key}: given more than once")
        given[key] = found[0]

    def bad(key: str, problem: str) -> None:
        report.add(patch.path, given[key].line, "trailers", f"{key}: {problem}")

    status = given.get("Upstream-Status")
    match = STATUS_VALUE.match(status.value) if status else None
    word = match["word"] if match and match["word"] in UPSTREAM_STATUSES else None
    if status and word is None:
        bad("Upstream-Status", f"{status.value!r} is not one of {', '.join(UPSTREAM_STATUSES)}")
    pr = given.get("Upstream-PR")
    pr_none = pr is not None and pr.value == "none"
    if pr and not PR_VALUE.match(pr.value) and not (pr_none and word in STATUSES_WITHOUT_PR):
        hint = f" ('none' is only for {' or '.join(STATUSES_WITHOUT_PR)})" if pr_none else ""
        bad("Upstream-PR", f"{pr.value!r} is not owner/repo#NUMBER or a GitHub pull URL{hint}")
    if "Upstream-Release" not in given:
        return
    release = given["Upstream-Release"].value
    if release == "none":
        if word == "Backport":
            bad("Upstream-Release", "a Backport must name the release that has the fix")
    elif not RELEASE_VALUE.match(release):
        bad("Upstream-Release", f"{release!r} is not a version like 0.5.19 (or 'none')")
    elif word == "Backport" and base_version and release_key(release) <= release_key(base_version):
        problem = f"{release} is not newer than the pinned base {base_version}"
        bad("Upstream-Release", f"{problem}, so the base already has this fix")


def _check_lines(report: LintReport, patch: Patch) -> None:
    for diff in patch.files:
        for line in (line for hunk in diff.hunks for line in hunk if line.kind == "+"):
            report.checked["whitespace"] += 1
            if line.text != line.text.rstrip():
                problem = f"added line {diff.path}:{line.new_line} ends in whitespace"
                report.add(patch.path, line.patch_line, "whitespace", problem)
        for number in diff.new_lacks_final_newline:
            problem = f"after this patch {diff.path} would end without a newline"
            report.add(patch.path, number, "final-newline", problem)


def _check_file_bytes(report: LintReport, path: Path) -> None:
    if not path.is_file():
        return
    report.checked.update(("final-newline", "line-endings"))
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        line = data.count(b"\n") + 1
        report.add(path, line, "final-newline", "no newline at the end of the file")
    if b"\r" in data:
        problem = "a carriage return (CRLF line endings?): this file must be byte-exact LF; a "
        problem += "clone with core.autocrlf=true rewrites it unless .gitattributes says -text"
        report.add(path, data[: data.index(b"\r")].count(b"\n") + 1, "line-endings", problem)


def lint_patch_set(folder: Path) -> LintReport:
    require_folder(folder)
    report = LintReport(folder)
    entries, paths = _read_series(report, folder)
    try:
        manifest: PinManifest | None = PinManifest.load(folder / MANIFEST_NAME)
        report.checked["manifest"] += 1
    except BackportError as err:
        report.add(folder / MANIFEST_NAME, None, "manifest", err.problem)
        manifest = None
    for path in (folder / SERIES_NAME, folder / MANIFEST_NAME, *paths):
        _check_file_bytes(report, path)
    patches = [parse_patch(path) for path in paths]
    for patch in patches:
        report.patches.append(patch.path.name)
        _check_message(report, patch, manifest.base.version if manifest else None)
        _check_lines(report, patch)
        if manifest is not None:
            _check_allow_list(report, manifest, patch)
            _check_pins(report, manifest, patch)
        if not any(diff.hunks for diff in patch.files):
            report.add(patch.path, None, "nothing-checked", "this patch changes no file")
    if manifest is not None:
        _check_manifest(report, manifest, entries)
        report.checked["build-wheel"] += 1
        for problem in label_problems(manifest):
            report.add(folder / MANIFEST_NAME, None, "build-wheel", problem)
    if not patches or not report.checked["whitespace"]:
        why = "a lint that checks nothing must not pass (is the series empty, or the folder wrong?)"
        report.add(folder, None, "nothing-checked", f"no patch with added lines was checked; {why}")
    return report


BUILD_TABLE = "build-wheel"
# PEP 440 local version label, normalized, so file name, folder and METADATA spell it alike.
LOCAL_LABEL = re.compile(r"^[a-z0-9]+(?:\.[a-z0-9]+)*$")


def series_sha256(manifest: PinManifest) -> str:
    """One hash of the whole series: sha256 over its 'name sha256' lines, in order."""
    lines = "".join(f"{name} {digest}\n" for name, digest in manifest.patch_hashes.items())
    return hashlib.sha256(lines.encode()).hexdigest()


def label_problems(manifest: PinManifest) -> list[str]:
    """What is wrong with the manifest's [build-wheel] table; empty when it is right."""
    table, actual = manifest.raw.get(BUILD_TABLE), series_sha256(manifest)
    if table is None:  # PinManifest.load refused a [build-wheel] that is not a table
        add = f'add one with local = "pdrace.N" and series-sha256 = "{actual}"'
        return [f"no [{BUILD_TABLE}] table: {add}"]
    problems = []
    if not LOCAL_LABEL.match(local := manifest.local_version):  # a string: PinManifest.load
        problems.append(
            f"[{BUILD_TABLE}] local = {local!r} is not a PEP 440 local version label in "
            "normalized form (lower-case letters and digits, joined by dots, e.g. pdrace.2)"
        )
    if (pinned := table.get("series-sha256", "")) != actual:
        problems.append(
            f"[{BUILD_TABLE}] series-sha256 is {pinned!r}, but the series now hashes to "
            f"{actual}: the series changed, so give the wheel a new label (change local, "
            f'e.g. raise its number) and set series-sha256 = "{actual}"'
        )
    return problems
