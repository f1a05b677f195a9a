"""apply-patches --3way: a served release's series merged onto a fork of it, kept only if fixed."""

import re
import shlex
from pathlib import Path

from . import apply, lock, paths, shape
from . import wheel as wheels
from .buildtree import default_branch, files_at
from .catalog import Files, blobs_of, full_check, load_catalog
from .errors import BackportError, Exit
from .git import Git
from .manifest import Series, git_blob_id, series_for_release
from .shapeflow import CannotTell, Sources, functions

# A patch's blob ids (exported with --full-index): "index <pre>..<post>[ <mode>]".
INDEX_LINE = re.compile(r"^(index )([0-9a-f]{40})\.\.([0-9a-f]{40})", re.M)
Touched = list[tuple[str, str]]  # (path, function) that both the fork and the series change


def onto_fork(
    where: Path,
    branch: str | None,
    series: Series | None,
    release: str | None,
    git: Git,
    head: str,
    files: Files,
) -> apply.ApplyReport:
    """--3way under the repository's lock: an apply.OntoFork once the first four are bound."""
    if series is None:
        catalog = load_catalog(paths.PATCHES_ROOT)
        release = release or catalog.nearest_release(blobs_of(files), catalog.served)
        if release is None:
            raise BackportError(
                Exit.BASE_MISMATCH,
                f"{where} shares no file with a served release ({', '.join(catalog.served)}), "
                "so which release it is a fork of cannot be told from its files",
                "name it: add --base VERSION (one of those releases) to --3way",
            )
        series = series_for_release(paths.PATCHES_ROOT, release)
    apply.verify(series)
    manifest = series.manifest
    branch = branch or default_branch(manifest)
    if not (exists := git.branch_exists(branch)):
        apply.refuse_clash(git, branch, where)
    wheel = wheels.fetch_wheel(manifest.base, paths.cache_dir())
    per_step = apply.files_per_step(series, wheels.read_files(wheel, manifest.files))
    ours = fork_changes(per_step[manifest.steps[0]], files, per_step[manifest.final_step])
    note = (
        f"\n(Applied onto {head[:12]}, a fork of sglang {manifest.base.version}, "
        "by scripts/apply-patches --3way: git's three-way merge, the result "
        "judged fixed by its code shape.)\n"
    )
    with lock.marked_folder(lock.tmpdir(), apply.TEMP_PREFIX) as scratch:
        ids = _write_preimages(git, per_step)
        # each merge driver of the user's is run as `false`: no program of theirs runs
        merger, drivers = git.overriding("merge", "driver", {"driver": "false"})
        merger = merger.with_env({"GIT_INDEX_FILE": str(scratch / "index")})
        merger.run("read-tree", head)
        tip = head
        apply.commit_identity(git)
        for patch in series.patch_paths:
            if conflict := _merge(merger, patch, ids, drivers):
                raise BackportError(
                    Exit.APPLY_FAILED,
                    f"patch {patch.name} of sglang {manifest.base.version}'s series {conflict[0]}"
                    f" on {where}, even with git's three-way merge:\n{conflict[1]}" + _said(ours),
                    "nothing of yours was changed (no branch was made); port the series by "
                    f"hand on a branch of your fork (`git -C {shlex.quote(str(where))} am -3 "
                    f"{shlex.quote(str(patch.parent))}/*.patch` stops at the conflict: the "
                    "preimages are in your repository now), then check it with "
                    + full_check(where),
                )
            tip = apply.commit_patch(git, patch, merger.out("write-tree"), tip, scratch, note)
        merged = files_at(git, tip, manifest)
        judged = shape.judge(Sources.from_texts(merged))
        if not judged.fixed:
            raise BackportError(
                Exit.APPLY_FAILED,
                f"the series of sglang {manifest.base.version} merged onto {where} "
                "without conflicts, but the result is not judged fixed by its code shape:\n"
                + "\n".join(f"  {line}" for line in judged.lines())
                + _said(ours),
                "nothing of yours was changed (no branch was made); your fork orders "
                "the prebuilt path in its own way, so make the fix there by hand "
                f"(docs/apply.md, --3way), then check it with {full_check(where)}",
            )
        if not exists:
            apply.create_branch(git, branch, tip, where)
        elif files_at(git, f"refs/heads/{branch}", manifest) != merged:
            raise BackportError(
                Exit.BRANCH_EXISTS,
                f"branch {branch} already exists in {where} and does not hold this merge",
                f"{apply.delete_or_rename(branch, where)}; nothing of yours was changed",
            )
    done = list(series.patch_names)
    notes = [
        f"merged onto a fork of sglang {manifest.base.version} with git's three-way "
        f"merge; judged by code shape: {judged.verdict} ({judged.reason})",
        *_said(ours).strip().splitlines(),
        f"next step, the full check: {full_check(where)} (after switching to the branch)",
    ]
    return apply.ApplyReport(where, branch, [] if exists else done, done if exists else [], notes)


def _merge(
    merger: Git, patch: Path, ids: dict[str, str], drivers: list[str]
) -> tuple[str, str] | None:
    """Merge one patch into the temporary index: None, or (what failed, git's words)."""
    text = INDEX_LINE.sub(
        lambda m: m[1] + ids.get(m[2], m[2]) + ".." + ids.get(m[3], m[3]),
        patch.read_text(encoding="utf-8"),
    )
    prefix = [f"--directory={merger.prefix}"] if merger.prefix else []
    done = merger.run("apply", "--cached", "--3way", *prefix, input=text, check=False)
    if done.returncode == 0:
        return None
    unmerged = merger.run("ls-files", "--unmerged", "-z").stdout.split("\0")
    paths = sorted({entry.split("\t", 1)[1] for entry in unmerged if "\t" in entry})
    what = f"conflicts in {', '.join(paths)}" if paths else "does not apply"
    if paths and drivers:
        what += (
            f" (the merge drivers your git configuration names, {', '.join(drivers)}, "
            "are not run here: a file one of them would merge counts as a conflict)"
        )
    return what, (done.stdout + done.stderr).strip()


def _write_preimages(git: Git, per_step: dict[str, dict[str, bytes]]) -> dict[str, str]:
    """Every step's files as loose objects: sha1 blob id -> the repository's (sha256) id."""
    blobs = {git_blob_id(data): data for files in per_step.values() for data in files.values()}
    write = ("hash-object", "-w", "--no-filters", "--stdin")
    return {
        sha1: git.run(*write, input=data).stdout.decode().strip() for sha1, data in blobs.items()
    }


def _functions(data: bytes | None, path: str) -> dict[str, str] | None:
    """Each top-level function and method (by qualified name) -> its source; None: no parse."""
    sources = Sources.from_texts({path: data})
    try:
        found = functions(sources.module(path), path)
    except CannotTell:
        return None
    lines = re.findall(r"[^\r\n]*(?:\r\n?|\n)|[^\r\n]+\Z", sources.text(path) or "")  # as ast does
    return {fn.name: "".join(lines[fn.node.lineno - 1 : fn.node.end_lineno]) for fn in found}


def fork_changes(base: dict[str, bytes], fork: Files, patched: dict[str, bytes]) -> Touched:
    """(path, Class.method) that both fork and series change from base; unparsable: whole file."""
    found = []
    for path, data in base.items():
        old, theirs, new = (_functions(d, path) for d in (data, fork.get(path), patched[path]))
        if theirs is None:
            found.append((path, "(the whole file: it does not parse)"))
        elif old is not None and new is not None:
            names = sorted(old.keys() | theirs.keys() | new.keys())
            found += [(path, n) for n in names if old.get(n) not in (theirs.get(n), new.get(n))]
    return found


def _said(ours: Touched) -> str:
    if not ours:
        return "\nNone of your fork's changes is in a function the series changes."
    listed = "".join(f"\n  {path} {name}" for path, name in ours)
    return "\nYour fork's own changes touch these functions the series changes:" + listed
