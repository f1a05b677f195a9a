"""Lint one patch set folder: series, patches and pin manifest must agree.

Every rule adds what it found to one report, so a single run lists every
problem with its file and line. A run that had nothing to check is itself a
failure: a linter that silently checks nothing looks exactly like one that
passes.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BackportError
from .manifest import (
    BASE_STEP,
    MANIFEST_NAME,
    SERIES_NAME,
    PinManifest,
    release_key,
    require_folder,
    sha256_of,
    step_of,
)
from .patchfile import Patch, line_naming, parse_patch, touched_paths

# Yocto's list; the patch set uses the word only, or the word and "[detail]".
UPSTREAM_STATUSES = (
    "Pending",
    "Submitted",
    "Denied",
    "Inappropriate",
    "Backport",
    "Inactive-Upstream",
)
REQUIRED_TRAILERS = ("Upstream-Status", "Upstream-PR", "Upstream-Release")
# Statuses for which no upstream pull request exists to name.
STATUSES_WITHOUT_PR = ("Pending", "Inappropriate")

STATUS_VALUE = re.compile(r"^(?P<word>[A-Za-z-]+)(?: \[[^\]]+\])?$")
PR_VALUE = re.compile(r"^(?:[\w.-]+/[\w.-]+#\d+|https://github\.com/[\w.-]+/[\w.-]+/pull/\d+)$")
RELEASE_VALUE = re.compile(r"^\d+(?:\.\d+)+(?:\.post\d+)?$")

RULES = {
    "series": "series lists every patch file once, and only files that exist",
    "manifest": "pin.toml loads; its patch hashes, order and blob ids match, the base's "
    "also releases.toml's",
    "allow-list": "patches touch only the files named in the manifest's [blobs]",
    "description": "every patch has a subject and a description of why",
    "trailers": "Upstream-Status, Upstream-PR and Upstream-Release, valid values; a "
    "Backport's PR and first release are releases.toml's for the fix its step adds",
    "whitespace": "no trailing whitespace on added lines",
    "final-newline": "every file of the patch set, and every patched file, ends with a newline",
    "line-endings": "every file of the patch set has LF line endings, byte for byte (no CR)",
    "build-wheel": "[build-wheel] local is a PEP 440 local label; series-sha256 is the series'",
    "nothing-checked": "the run checked at least one patch with a diff",
}


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int | None
    rule: str
    message: str

    def render(self, root: Path | None = None) -> str:
        shown = _display(self.path, root)
        where = f"{shown}:{self.line}" if self.line else shown
        return f"{where}: [{self.rule}] {self.message}"


@dataclass
class LintReport:
    folder: Path
    violations: list[Violation] = field(default_factory=list)
    # what each rule looked at, so "nothing checked" can be told from "clean"
    checked: Counter[str] = field(default_factory=Counter)
    patches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, path: Path, line: int | None, rule: str, message: str) -> None:
        self.violations.append(Violation(path, line, rule, message))


def _display(path: Path, root: Path | None) -> str:
    base = root or Path.cwd()
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def _read_series(report: LintReport, series_file: Path) -> list[tuple[str, int]]:
    if not series_file.is_file():
        report.add(series_file, None, "series", "the series file does not exist")
        return []
    entries: list[tuple[str, int]] = []
    for number, line in enumerate(series_file.read_text(encoding="utf-8").splitlines(), 1):
        name = line.strip()
        if name and not name.startswith("#"):
            entries.append((name, number))
    return entries


def _check_series(report: LintReport, folder: Path, entries: list[tuple[str, int]]) -> list[Path]:
    """Series rule; returns the listed patches that exist, once each, in order."""
    series_file = folder / SERIES_NAME
    seen: dict[str, int] = {}
    existing: list[Path] = []
    for name, number in entries:
        report.checked["series"] += 1
        if name in seen:
            report.add(
                series_file,
                number,
                "series",
                f"{name} is listed again (first on line {seen[name]}); list each patch once",
            )
            continue
        seen[name] = number
        if "/" in name or not (folder / name).is_file():
            report.add(
                series_file,
                number,
                "series",
                f"{name} is listed but there is no such file in {folder.name}/",
            )
            continue
        existing.append(folder / name)
    for path in sorted(folder.glob("*.patch")):
        report.checked["series"] += 1
        if path.name not in seen:
            report.add(
                path,
                None,
                "series",
                "this patch file is not listed in series; list it, or delete it",
            )
    return existing


def _load_manifest(report: LintReport, folder: Path) -> PinManifest | None:
    try:
        manifest = PinManifest.load(folder / MANIFEST_NAME)
    except BackportError as err:
        report.add(folder / MANIFEST_NAME, None, "manifest", err.problem)
        return None
    report.checked["manifest"] += 1
    return manifest


def _check_manifest(
    report: LintReport,
    folder: Path,
    manifest: PinManifest,
    entries: list[tuple[str, int]],
    patches: list[Patch],
) -> None:
    pin = folder / MANIFEST_NAME
    listed = [name for name, _ in entries]
    pinned = list(manifest.patch_hashes)
    for name, number in entries:
        if name not in manifest.patch_hashes:
            report.add(
                folder / SERIES_NAME,
                number,
                "manifest",
                f"{name} has no sha256 in {MANIFEST_NAME} [patches]; run scripts/export-patches",
            )
    for name in pinned:
        if name not in listed:
            report.add(pin, None, "manifest", f"[patches] pins {name}, which series does not list")
    common = [n for n in listed if n in manifest.patch_hashes]
    if common != [n for n in pinned if n in listed]:
        report.add(
            pin,
            None,
            "manifest",
            f"[patches] orders the patches {pinned}, series orders them {listed}",
        )
    for release in manifest.releases:
        report.checked["manifest"] += 1
        known = manifest.registry.known[release].blobs
        if known != manifest.blobs_at(BASE_STEP):
            report.add(
                pin,
                None,
                "manifest",
                f"[blobs] base holds {manifest.blobs_at(BASE_STEP)}, but "
                f'{manifest.registry.path} [releases."{release}"] blobs are {known}: '
                "one of them is wrong; hash the release's wheel (docs/maintaining.md)",
            )
    for patch in patches:
        pinned_hash = manifest.patch_hashes.get(patch.path.name)
        if pinned_hash is not None:
            report.checked["manifest"] += 1
            actual = sha256_of(patch.path)
            if actual != pinned_hash:
                report.add(
                    patch.path,
                    None,
                    "manifest",
                    f"sha256 is {actual}, but {MANIFEST_NAME} pins {pinned_hash}; "
                    "if the change is wanted, make it on the patched branch and "
                    "run scripts/export-patches",
                )
        _check_blob_ids(report, manifest, patch)


def _check_blob_ids(report: LintReport, manifest: PinManifest, patch: Patch) -> None:
    """The full index lines of a patch must name the manifest's blobs of its step."""
    step = step_of(patch.path.name)
    if step not in manifest.steps[1:]:
        return
    before = manifest.steps[manifest.steps.index(step) - 1]
    for diff in patch.files:
        by_step = manifest.blobs.get(diff.path)
        if by_step is None or diff.old_blob is None:
            continue
        report.checked["manifest"] += 1
        for side, blob, expected_step in (
            ("pre", diff.old_blob, before),
            ("post", diff.new_blob, step),
        ):
            expected = by_step.get(expected_step)
            if expected is not None and blob != expected:
                report.add(
                    patch.path,
                    diff.index_line,
                    "manifest",
                    f"{diff.path}: {side}-image blob {blob}, but [blobs] pins "
                    f"{expected} at step {expected_step}",
                )


def _check_allow_list(report: LintReport, manifest: PinManifest, patch: Patch) -> None:
    allowed = set(manifest.files)
    touched, problem = touched_paths(patch.path)
    report.checked["allow-list"] += 1
    if problem:
        report.add(patch.path, None, "allow-list", f"git cannot read this patch: {problem}")
    for path in dict.fromkeys(touched):
        if path not in allowed:
            report.add(
                patch.path,
                line_naming(patch, path),
                "allow-list",
                f"touches {path}, which is not one of the files this series "
                f"may change ({', '.join(sorted(allowed))}); add it to the "
                "manifest's [blobs] only if the fix really needs it",
            )


def _check_description(report: LintReport, patch: Patch) -> None:
    report.checked["description"] += 1
    if not patch.subject:
        report.add(patch.path, 1, "description", "no Subject: header")
    if not patch.description:
        report.add(
            patch.path,
            patch.subject_line or 1,
            "description",
            "no description: say in the message body why the patch exists and "
            "when it can be dropped",
        )


def _check_trailers(report: LintReport, patch: Patch, base_version: str | None) -> None:
    report.checked["trailers"] += 1
    where = patch.subject_line or 1
    values: dict[str, str] = {}
    for key in REQUIRED_TRAILERS:
        found = patch.trailer(key)
        if not found:
            report.add(
                patch.path,
                where,
                "trailers",
                f"no {key}: trailer (put it in the last paragraph of the message)",
            )
            continue
        for extra in found[1:]:
            report.add(patch.path, extra.line, "trailers", f"{key}: given more than once")
        values[key] = found[0].value

    lines = {t.key.lower(): t.line for t in patch.trailers}
    status = values.get("Upstream-Status")
    word = None
    if status is not None:
        match = STATUS_VALUE.match(status)
        word = match["word"] if match else None
        if word not in UPSTREAM_STATUSES:
            report.add(
                patch.path,
                lines["upstream-status"],
                "trailers",
                f"Upstream-Status: {status!r} is not one of {', '.join(UPSTREAM_STATUSES)}",
            )
            word = None
    pr = values.get("Upstream-PR")
    pr_allowed_none = pr == "none" and word in STATUSES_WITHOUT_PR
    if pr is not None and not PR_VALUE.match(pr) and not pr_allowed_none:
        hint = f" ('none' is only for {' or '.join(STATUSES_WITHOUT_PR)})" if pr == "none" else ""
        report.add(
            patch.path,
            lines["upstream-pr"],
            "trailers",
            f"Upstream-PR: {pr!r} is not owner/repo#NUMBER or a GitHub pull URL{hint}",
        )
    release = values.get("Upstream-Release")
    if release is None:
        return
    line = lines["upstream-release"]
    if release == "none":
        if word == "Backport":
            report.add(
                patch.path,
                line,
                "trailers",
                "Upstream-Release: a Backport must name the release that has the fix",
            )
        return
    if not RELEASE_VALUE.match(release):
        report.add(
            patch.path,
            line,
            "trailers",
            f"Upstream-Release: {release!r} is not a version like 0.5.19 (or 'none')",
        )
    elif (
        word == "Backport"
        and base_version is not None
        and release_key(release) <= release_key(base_version)
    ):
        report.add(
            patch.path,
            line,
            "trailers",
            f"Upstream-Release: {release} is not newer than the pinned base "
            f"{base_version}, so the base already has this fix",
        )


def _check_upstream_facts(report: LintReport, manifest: PinManifest, patch: Patch) -> None:
    """A Backport's PR and release are those releases.toml gives the fix its step adds."""
    step = step_of(patch.path.name)
    if step not in manifest.steps[1:] or not patch.trailer("Upstream-Status"):
        return
    if not patch.trailer("Upstream-Status")[0].value.startswith("Backport"):
        return
    before = manifest.steps[manifest.steps.index(step) - 1]
    registry = manifest.registry
    for name in sorted(manifest.step_fixes[step] - manifest.step_fixes[before]):
        report.checked["trailers"] += 1
        fix = registry.fixes[name]
        first = next((r for r, k in registry.known.items() if name in k.fixes), None)
        expected = {"Upstream-PR": f"sgl-project/sglang#{fix.pr}", "Upstream-Release": first}
        for key, value in expected.items():
            found = patch.trailer(key)
            if found and value is not None and found[0].value != value:
                report.add(
                    patch.path,
                    found[0].line,
                    "trailers",
                    f"{key}: {found[0].value}, but {registry.path.name} says {name} "
                    f"(what step {step} adds, [step-fixes]) is {value}",
                )


def _check_whitespace(report: LintReport, patch: Patch) -> None:
    for diff in patch.files:
        for hunk in diff.hunks:
            for line in hunk.lines:
                if line.kind != "+":
                    continue
                report.checked["whitespace"] += 1
                if line.text != line.text.rstrip():
                    report.add(
                        patch.path,
                        line.patch_line,
                        "whitespace",
                        f"added line {diff.path}:{line.new_line} ends in whitespace",
                    )


def _check_final_newline(report: LintReport, path: Path) -> None:
    if not path.is_file():
        return
    report.checked["final-newline"] += 1
    report.checked["line-endings"] += 1
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        report.add(
            path, data.count(b"\n") + 1, "final-newline", "no newline at the end of the file"
        )
    if b"\r" in data:
        report.add(
            path,
            data[: data.index(b"\r")].count(b"\n") + 1,
            "line-endings",
            "a carriage return (CRLF line endings?): this file must be byte-exact LF; "
            "a clone with core.autocrlf=true rewrites it unless .gitattributes says -text",
        )


def _check_patched_newline(report: LintReport, patch: Patch) -> None:
    for diff in patch.files:
        for number in diff.new_lacks_final_newline:
            report.add(
                patch.path,
                number,
                "final-newline",
                f"after this patch {diff.path} would end without a newline",
            )


def lint_patch_set(folder: Path) -> LintReport:
    """Run every rule on one patch set folder."""
    require_folder(folder)
    report = LintReport(folder)
    entries = _read_series(report, folder / SERIES_NAME)
    paths = _check_series(report, folder, entries)
    manifest = _load_manifest(report, folder)
    for path in (folder / SERIES_NAME, folder / MANIFEST_NAME):
        _check_final_newline(report, path)

    patches: list[Patch] = []
    for path in paths:
        patch = parse_patch(path)
        patches.append(patch)
        report.patches.append(path.name)
        _check_final_newline(report, path)
        _check_description(report, patch)
        _check_trailers(report, patch, manifest.base.version if manifest else None)
        _check_whitespace(report, patch)
        _check_patched_newline(report, patch)
        if manifest is not None:
            _check_allow_list(report, manifest, patch)
            _check_upstream_facts(report, manifest, patch)
        if not any(diff.hunks for diff in patch.files):
            report.add(path, None, "nothing-checked", "this patch changes no file")
    if manifest is not None:
        _check_manifest(report, folder, manifest, entries, patches)
        report.checked["build-wheel"] += 1
        for problem in label_problems(manifest):
            report.add(folder / MANIFEST_NAME, None, "build-wheel", problem)

    if not patches or not report.checked["whitespace"]:
        report.add(
            folder,
            None,
            "nothing-checked",
            "no patch with added lines was checked; a lint that checks nothing "
            "must not pass (is the series empty, or the folder wrong?)",
        )
    return report


# --- [build-wheel]: the wheel's version label ------------------------------------

BUILD_TABLE = "build-wheel"
# PEP 440 local version label, in its normalized form (lower case, dots), so
# that the file name, the folder name and METADATA spell it the same way.
LOCAL_LABEL = re.compile(r"^[a-z0-9]+(?:\.[a-z0-9]+)*$")


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
