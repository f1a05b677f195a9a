"""patchset/shape.py on real trees: the served releases and steps and 0.5.19 to 0.5.23
judged as their blob ids say; forks made here judged as a person reading them would.

Every tree is real sglang: a step tree of scripts/run-tests, a wheel laid out, or a
copy of one with a few lines changed. Our wrong fixes (a wait that depends on the
batch) and the other forks below are copies of the session's patched 0.5.15.post1
tree or of 0.5.23's.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    SESSION_TREES,
    commit_all,
    fetch_or_skip,
    git,
    linked_copy,
    replace_text,
    slim_checkout_of,
)
from patchset import catalog, paths, shape, wheel
from patchset.manifest import Series, WheelPin, git_blob_id, load_releases, patch_set_folders

pytestmark = SESSION_TREES

STEPS = paths.PROJECT_ROOT / "build" / "steps"
REGISTRY = load_releases()
SERVED = [
    pytest.param(release, step, id=f"{release}-{step}")
    for series in map(Series.load, patch_set_folders(paths.PATCHES_ROOT))
    for release in series.manifest.releases
    for step in series.manifest.steps
]
# Releases past the served ones whose wheel releases.toml pins (0.5.19 to 0.5.23).
UPSTREAM = [v for v, known in REGISTRY.known.items() if known.wheel is not None]
DECODE = Path(shape.DECODE)
# 0.5.12.post1, before the race: FutureMap hands out fresh future slots.
BEFORE_THE_RACE = WheelPin(
    "0.5.12.post1",
    "sglang-0.5.12.post1-cp311-cp311-manylinux_2_34_x86_64.whl",
    "94b3f3cc6b97f1364f247b8d9c1d106ec63cf22c55d6b65bc40ff29b0206ef5f",
)

# What patch 0002 adds to get_new_prebuilt_batch on 0.5.15.post1.
IF_OVERLAP = "        if self.enable_overlap:\n            # A request that just finished"
WAIT = "            self.schedule_stream.wait_stream(self.forward_stream)\n"
PREPARE = "        new_batch.prepare_for_prebuilt()\n"
WAIT_GONE = "            pass\n"


def blob_verdict(tree: Path) -> str:
    """The verdict the one catalog gives the tree's three files by their blob ids."""
    known = catalog.load_catalog(paths.PATCHES_ROOT)
    blobs = {f: git_blob_id((tree / f).read_bytes()) for f in known.files}
    found = known.lookup(blobs)  # type: ignore[arg-type]
    assert found, f"the files of {tree} are no release or step the catalog knows"
    prs = found[0].fixes
    fix_a, fix_b = (f"sgl-project/sglang#{REGISTRY.fixes[f].pr}" for f in ("fix-a", "fix-b"))
    return shape.FIXED if fix_b in prs else shape.FIX_A_ONLY if fix_a in prs else shape.AFFECTED


def text_of(judgement: shape.Judgement) -> str:
    return "\n".join(judgement.lines())


@pytest.fixture(scope="module")
def upstream_trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """0.5.19 to 0.5.23, each wheel (hash-checked, from the cache) laid out as a tree."""
    trees = {}
    for version in UPSTREAM:
        pin = REGISTRY.known[version].wheel
        assert pin is not None
        tree = tmp_path_factory.mktemp(f"sglang-{version}")
        wheel.extract_package(fetch_or_skip(pin, paths.cache_dir()), tree)
        trees[version] = tree
    return trees


def edited(tree: Path, folder: Path, *edits: tuple[Path, str, str]) -> Path:
    """A copy of tree (hard links) with each (file, old, new): old, found once, made new."""
    linked_copy(tree, folder)
    for path, old, new in edits:
        source = (folder / path).read_text()
        assert source.count(old) == 1, f"{old!r} is not once in {path}: the code moved"
        replace_text(folder / path, source.replace(old, new))
    return folder


def moved(tree: Path, folder: Path, name: str) -> Path:
    """A copy of tree whose decode.py method `name` now lives in a mixin module of its own."""
    linked_copy(tree, folder)
    source = (folder / DECODE).read_text()
    module = ast.parse(source)
    method = next(
        node
        for cls in module.body
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.FunctionDef) and node.name == name
    )
    lines = source.splitlines(keepends=True)
    start = (method.decorator_list[0] if method.decorator_list else method).lineno - 1
    body = "".join(lines[start : method.end_lineno])
    replace_text(folder / DECODE, "".join(lines[:start] + lines[method.end_lineno :]))
    mixin = folder / DECODE.with_name("prebuilt_fork.py")
    mixin.write_text(f"class PrebuiltForkMixin:\n{body}")
    return folder


@pytest.mark.parametrize(("release", "step"), SERVED)
def test_every_served_step_is_judged_as_its_blob_ids_say(release: str, step: str) -> None:
    tree = STEPS / release / step
    if not (tree / "python" / "sglang").is_dir():
        pytest.skip(f"needs {tree}: run scripts/run-tests once")
    judged = shape.judge_tree(tree)
    assert judged.verdict == blob_verdict(tree), text_of(judged)


def test_the_releases_after_the_fix_are_judged_fixed(upstream_trees: dict[str, Path]) -> None:
    assert UPSTREAM == ["0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"]
    for version, tree in upstream_trees.items():
        judged = shape.judge_tree(tree)
        assert blob_verdict(tree) == shape.FIXED
        assert judged.verdict == shape.FIXED, f"{version}: {text_of(judged)}"
    # from 0.5.21 the wait is in the helper the entry calls; it is followed there
    text = text_of(shape.judge_tree(upstream_trees["0.5.21"]))
    assert "_get_new_prebuilt_batch: followed from" in text
    assert "_get_new_prebuilt_batch: a full ordering: self.schedule_stream.wait_stream" in text


def test_the_release_before_the_race_is_another_design(tmp_path: Path) -> None:
    wheel.extract_package(fetch_or_skip(BEFORE_THE_RACE, paths.cache_dir()), tmp_path)
    judged = shape.judge_tree(tmp_path)
    assert judged.verdict == shape.OTHER_DESIGN, text_of(judged)
    assert "FutureMap.alloc_future_indices: fresh future slots" in text_of(judged)


def test_the_evidence_names_each_piece_where_it_is(patched_tree: Path) -> None:
    text = text_of(shape.judge_tree(patched_tree))
    lines = text.splitlines()
    assert lines[0].startswith("fixed: every path with overlap on")
    decode = "srt/disaggregation/decode.py"
    source = (patched_tree / DECODE).read_text().splitlines()
    wait_line = source.index(WAIT.rstrip("\n")) + 1
    method = "SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch"
    assert f"  {decode}:{wait_line} {method}: a full ordering: " in text
    assert f"  {decode}:{wait_line + 1} {method}: new_batch.process_prebuilt(" in text
    # the WAR barrier is reported where it is, and never counted for fix B
    assert "_apply_war_barrier() before batch selection (not fix B)" in text
    assert "Scheduler._apply_war_barrier: waits with self.schedule_stream.wait_event(ev)" in text


CONDITIONS = {
    "one request": "len(can_run_list) == 1",
    "speculative only": "not self.spec_algorithm.is_none()",
    "running batch not empty": "not self.running_batch.is_empty()",
    "priority scheduling only": "self.enable_priority_scheduling",
    "CUDA only": "_is_cuda",
}


@pytest.mark.parametrize("condition", CONDITIONS.values(), ids=CONDITIONS.keys())
def test_a_wait_under_a_condition_is_not_fix_b(
    patched_tree: Path, tmp_path: Path, condition: str
) -> None:
    new = IF_OVERLAP.replace("self.enable_overlap:", f"self.enable_overlap and {condition}:")
    judged = shape.judge_tree(edited(patched_tree, tmp_path, (DECODE, IF_OVERLAP, new)))
    assert judged.verdict == shape.AFFECTED, text_of(judged)
    said = ast.unparse(ast.parse(f"self.enable_overlap and {condition}", mode="eval"))
    assert f"(runs only when {said})" in text_of(judged)


# (what the fork did, its edit of the patched 0.5.15.post1 decode.py, the verdict)
FORKS = {
    "a comment added": (PREPARE, "        # our fork: seed here\n" + PREPARE, shape.FIXED),
    "forward stream synchronized": (
        WAIT,
        "            self.forward_stream.synchronize()\n",
        shape.FIXED,
    ),
    "device synchronized": (WAIT, "            torch.cuda.synchronize()\n", shape.FIXED),
    "the device module synchronized": (
        WAIT,
        "            self.device_module.synchronize()\n",
        shape.FIXED,
    ),
    "streams of other names": (
        WAIT,
        "            self.sched_stream.wait_stream(self.model_stream)\n",
        shape.CANNOT_TELL,
    ),
    "a local named as the flag": (
        IF_OVERLAP,
        "        enable_overlap = self.enable_overlap and len(can_run_list) == 1\n"
        + IF_OVERLAP.replace("self.enable_overlap", "enable_overlap"),
        shape.AFFECTED,
    ),
    "no wait": (WAIT, WAIT_GONE, shape.AFFECTED),
    "the wait with overlap off": (
        IF_OVERLAP,
        IF_OVERLAP.replace("self.enable_overlap", "not self.enable_overlap"),
        shape.AFFECTED,
    ),
    "another stream waits": (
        WAIT,
        "            self.copy_stream.wait_stream(self.forward_stream)\n",
        shape.AFFECTED,
    ),
    "a read-done event": (
        WAIT,
        "            self.schedule_stream.wait_event(self.forward_read_done)\n",
        shape.AFFECTED,
    ),
    "a wait per request": (
        WAIT,
        "            for _ in new_batch.reqs:\n    " + WAIT,
        shape.AFFECTED,
    ),
    "the wait before prepare": (
        PREPARE,
        "        self.schedule_stream.wait_stream(self.forward_stream)\n" + PREPARE,
        shape.FIXED,  # the later wait still stands: a second, earlier one changes nothing
    ),
}


@pytest.mark.parametrize("old, new, verdict", FORKS.values(), ids=FORKS.keys())
def test_a_fork_is_judged_as_a_person_would(
    patched_tree: Path, tmp_path: Path, old: str, new: str, verdict: str
) -> None:
    judged = shape.judge_tree(edited(patched_tree, tmp_path, (DECODE, old, new)))
    assert judged.verdict == verdict, text_of(judged)


def test_a_wait_on_every_branch_of_an_unknown_condition_is_fix_b(
    patched_tree: Path, tmp_path: Path
) -> None:
    branches = IF_OVERLAP.replace("self.enable_overlap", "len(can_run_list) > 1")
    tree = edited(
        patched_tree,
        tmp_path,
        (DECODE, IF_OVERLAP, branches),
        (DECODE, WAIT, WAIT + "        else:\n" + WAIT),
    )
    judged = shape.judge_tree(tree)
    assert judged.verdict == shape.FIXED, text_of(judged)


def test_a_wait_only_before_prepare_cannot_be_told(patched_tree: Path, tmp_path: Path) -> None:
    tree = edited(
        patched_tree,
        tmp_path,
        (DECODE, WAIT, WAIT_GONE),
        (
            DECODE,
            PREPARE,
            "        self.schedule_stream.wait_stream(self.forward_stream)\n" + PREPARE,
        ),
    )
    judged = shape.judge_tree(tree)
    assert judged.verdict == shape.CANNOT_TELL, text_of(judged)
    assert "with the ordering before prepare_for_prebuilt(), not after it" in judged.reason


def test_a_function_moved_to_another_module_is_followed(
    patched_tree: Path, session_step_trees: dict[str, Path], tmp_path: Path
) -> None:
    fixed = shape.judge_tree(moved(patched_tree, tmp_path / "fixed", shape.ENTRY))
    assert fixed.verdict == shape.FIXED, text_of(fixed)
    assert "srt/disaggregation/prebuilt_fork.py:" in text_of(fixed)
    unpatched = moved(session_step_trees["base"], tmp_path / "unpatched", shape.ENTRY)
    assert shape.judge_tree(unpatched).verdict == shape.AFFECTED


def test_0_5_23s_helper_moved_away_is_followed_and_its_wait_removed_is_not(
    upstream_trees: dict[str, Path], tmp_path: Path
) -> None:
    tree = moved(upstream_trees["0.5.23"], tmp_path / "moved", "_get_new_prebuilt_batch")
    judged = shape.judge_tree(tree)
    assert judged.verdict == shape.FIXED, text_of(judged)
    assert "prebuilt_fork.py:" in text_of(judged)
    assert "(another module)" in text_of(judged)
    no_wait = edited(upstream_trees["0.5.23"], tmp_path / "no-wait", (DECODE, WAIT, WAIT_GONE))
    judged = shape.judge_tree(no_wait)
    assert judged.verdict == shape.AFFECTED, text_of(judged)
    assert judged.reason.startswith("SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch")


def test_what_cannot_be_read_is_said(patched_tree: Path, tmp_path: Path) -> None:
    renamed = edited(
        patched_tree,
        tmp_path / "renamed",
        (DECODE, "    def get_new_prebuilt_batch(", "    def get_next_prebuilt_batch("),
    )
    judged = shape.judge_tree(renamed)
    assert (judged.verdict, judged.reason) == (
        shape.CANNOT_TELL,
        "get_new_prebuilt_batch is in no file of the tree (moved out of it, or renamed)",
    )
    missing = linked_copy(patched_tree, tmp_path / "missing")
    (missing / DECODE).unlink()
    judged = shape.judge_tree(missing)
    assert (judged.verdict, judged.reason) == (shape.CANNOT_TELL, f"{shape.DECODE} is missing")
    broken = edited(
        patched_tree, tmp_path / "broken", (DECODE, PREPARE, PREPARE + "        if (:\n")
    )
    judged = shape.judge_tree(broken)
    assert judged.reason.startswith(f"{shape.DECODE} does not parse:"), text_of(judged)


def test_futuremap_moved_is_followed_and_missing_is_said(
    patched_tree: Path, tmp_path: Path
) -> None:
    tree = linked_copy(patched_tree, tmp_path / "moved")
    overlap = tree / shape.OVERLAP
    overlap.rename(overlap.with_name("future_map.py"))
    judged = shape.judge_tree(tree)
    assert judged.verdict == shape.FIXED, text_of(judged)
    assert "srt/managers/future_map.py:" in text_of(judged)
    (tree / shape.OVERLAP).with_name("future_map.py").unlink()
    judged = shape.judge_tree(tree)
    assert judged.verdict == shape.CANNOT_TELL, text_of(judged)
    assert judged.reason.startswith("the tree (overlap_utils.py missing) has no FutureMap")


def test_a_cherry_pick_onto_a_fork_with_git_am_3way_is_judged_fixed(
    series: Series, wheel_cache: Path, tmp_path: Path
) -> None:
    """The fork changed a line in the patch's context: plain git am refuses, -3 applies."""
    files = [*series.manifest.files, shape.MIXIN, shape.SCHEDULER]
    repo = slim_checkout_of(wheel_cache / series.manifest.base.wheel, files, tmp_path, "release")
    comment = "        # construct fake completed prefill\n"
    decode = repo / DECODE
    decode.write_text(decode.read_text().replace(comment, comment.rstrip() + " (our fork)\n"))
    commit_all(repo, "our fork")
    assert shape.judge_tree(repo).verdict == shape.AFFECTED
    patches = [str(p) for p in series.patch_paths]
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    plain = git_result(repo, *identity, "am", *patches)
    assert plain.returncode != 0, "the fork's edit must be in the patch's context"
    git(repo, "am", "--abort")
    git(repo, *identity, "am", "-3", *patches)
    judged = shape.judge_tree(repo)
    assert judged.verdict == shape.FIXED, text_of(judged)
    assert " (our fork)" in decode.read_text()


def git_result(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)


def test_only_the_standard_library_and_python_3_10_syntax() -> None:
    """check-install's zipapp carries the judgement to interpreters as old as 3.10."""
    for name in ("shape.py", "shapeflow.py"):
        source = (paths.PROJECT_ROOT / "scripts" / "patchset" / name).read_text()
        module = ast.parse(source, feature_version=(3, 10))
        for node in ast.walk(module):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            assert all(r in sys.stdlib_module_names for r in roots), (name, roots)
            assert "tomllib" not in roots, name
    assert shutil.which("git")  # the cherry-pick test above needs it
