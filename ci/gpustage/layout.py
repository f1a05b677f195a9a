"""Git-less step trees from the wheel and the step files written where git is; blob ids checked."""

import os
import shutil
from functools import partial
from pathlib import Path

from patchset import wheel as wheels
from patchset.apply import files_per_step
from patchset.errors import BackportError, Exit
from patchset.lock import marked_folder
from patchset.manifest import BASE_STEP, Series, git_blob_id

MARKER = ".laid-out-by-run-gpu"  # a tree laid out here, which a later run may replace
AGAIN = "make them again where git is, with `ci/run-gpu step-files --out DIR`, and carry DIR"
_refuse = partial(BackportError, Exit.SETUP, next_step=AGAIN)


def write_step_files(series: Series, wheel: Path, out: Path) -> list[Path]:
    """Write every touched file of every step after the base under out; the paths written."""
    per_step = files_per_step(series, wheels.read_files(wheel, series.manifest.files))
    written = []
    for step, files in per_step.items():
        for path, data in files.items() if step != BASE_STEP else ():
            (target := out / step / path).parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            written.append(target)
    return written


def carried_files(series: Series, folder: Path) -> dict[str, dict[str, bytes]]:
    """step -> path -> bytes of the carried files, each checked against pin.toml, or refuse."""
    manifest, steps = series.manifest, series.manifest.steps[1:]
    if not folder.is_dir():
        raise _refuse(
            f"the step files folder {folder} does not exist: the step trees cannot be laid out"
        )
    expected = {folder / step / path: (step, path) for step in steps for path in manifest.files}
    if extra := sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p not in expected
    ):
        raise _refuse(
            f"{folder} holds {', '.join(extra)}: no touched file of a step of {series.folder.name}"
        )
    carried: dict[str, dict[str, bytes]] = {step: {} for step in steps}
    for file, (step, path) in expected.items():
        if not file.is_file():
            raise _refuse(f"{folder} lacks {step}/{path}, a touched file of step {step}")
        carried[step][path] = file.read_bytes()
        _check_blob(series, step, path, carried[step][path], f"the carried {file}")
    return carried


def _check_blob(series: Series, step: str, path: str, data: bytes, where: str) -> None:
    want = series.manifest.blobs_at(step)[path]
    if (have := git_blob_id(data)) != want:
        raise _refuse(
            f"{where} has blob id {have}, but {series.folder.name}/pin.toml pins {want} "
            f"for {path} at step {step}: it is not this series' file"
        )


def tree_path(root: Path, series: Series, step: str) -> Path:
    """The folder whose python/ holds step's sglang, as build/steps/ does for git worktrees."""
    return root / series.manifest.base.version / step


def lay_out(series: Series, wheel: Path, step_files: Path, root: Path) -> dict[str, Path]:
    """step -> its tree: later steps hard-link the base's; a carried file replaces a link."""
    carried = carried_files(series, step_files)
    trees: dict[str, Path] = {}
    for step in series.manifest.steps:
        tree = tree_path(root, series, step)
        if tree.exists():
            if not (tree / MARKER).is_file():
                raise BackportError(
                    Exit.SETUP,
                    f"{tree} exists and was not laid out by ci/run-gpu: it is left as it is",
                    "move it aside, or pass another build folder (SGLANG_BACKPORTS_BUILD)",
                )
            shutil.rmtree(tree)
        tree.parent.mkdir(parents=True, exist_ok=True)
        with marked_folder(tree.parent, f".{step}.partial-") as tmp:
            aside = tmp / step
            if trees:
                ignore = shutil.ignore_patterns(MARKER)
                shutil.copytree(trees[BASE_STEP], aside, copy_function=os.link, ignore=ignore)
            else:
                wheels.extract_package(wheel, aside)
            for path, data in carried.get(step, {}).items():
                (aside / path).unlink()
                (aside / path).write_bytes(data)
            for path in series.manifest.files:
                where = f"{path} in the laid-out tree of step {step} (from {wheel.name}"
                where += " and the carried files)" if step in carried else ")"
                _check_blob(series, step, path, (aside / path).read_bytes(), where)
            (aside / MARKER).write_text("made by ci/run-gpu; replaced by its next run\n")
            aside.replace(tree)
        trees[step] = tree
    return trees
