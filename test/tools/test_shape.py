"""patchset/shape.py on real trees: the served releases and steps judged as their blob ids
say (0.5.19 to 0.5.23: test_watch_releases, which judges each wheel's files with the same
shape.judge); forks made here judged as a person reading them would.

Every tree is real sglang: a step tree of scripts/run-tests, a wheel laid out, or a
copy of one with a few lines changed. Our wrong fixes (a wait that depends on the
batch) and the other forks below are copies of the session's patched 0.5.15.post1
tree or of 0.5.23's. Most are judged from their files' texts held here (Texts: every
.py file of the package, read once per tree), as judge_tree judges the folder after
reading the same files: a copy of 2,500 files per fork, and reading them again,
cost a second each on this host. judge_tree itself reads each served release's
base tree, the session's patched tree, the fifo and link-loop tree of
test_check_install_shape, and a checkout made by git am.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import SESSION_TREES, commit_all, fetch_or_skip, git, slim_checkout_of
from patchset import catalog, paths, shape, wheel
from patchset import shapeflow as sf
from patchset.manifest import (
    Series,
    WheelPin,
    git_blob_id,
    load_releases,
    patch_set_folders,
    series_for_release,
)

# Only the tests of the session's patched tree carry SESSION_TREES (its worker runs that
# group's files one after another); the rest, on run-tests' release trees and the wheels,
# are this file's own group and run beside it.
STEPS = paths.PROJECT_ROOT / "build" / "steps"
REGISTRY = load_releases()
SERVED = [
    pytest.param(release, step, id=f"{release}-{step}")
    for series in map(Series.load, patch_set_folders(paths.PATCHES_ROOT))
    for release in series.manifest.releases
    for step in series.manifest.steps
]
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


# A tree's .py files by repository path (python/sglang/...), as shapeflow.Sources reads
# a folder: bytes, or None for what it does not read (too large).
Texts = dict[str, bytes | str | None]


def texts_of(tree: Path) -> Texts:
    """Every .py file of tree/python/sglang."""
    package = tree / "python" / "sglang"
    texts: Texts = {}
    for path in package.rglob("*.py"):
        data = path.read_bytes()
        texts[sf.PREFIX + path.relative_to(package).as_posix()] = (
            data if len(data) <= sf.MAX_SOURCE_BYTES else None
        )
    return texts


def wheel_texts(pin: WheelPin) -> Texts:
    """Every .py file of the pinned wheel's sglang/ (hash-checked, from the cache), as
    texts_of reads them from the wheel laid out (wheel.extract_package)."""
    with zipfile.ZipFile(fetch_or_skip(pin, paths.cache_dir())) as archive:
        return {
            wheel.REPO_PREFIX + m.filename: archive.read(m)
            if m.file_size <= sf.MAX_SOURCE_BYTES
            else None
            for m in archive.infolist()
            if m.filename.startswith("sglang/") and m.filename.endswith(".py") and not m.is_dir()
        }


def judge(texts: Texts) -> shape.Judgement:
    """shape.judge_tree's judgement of a tree holding these files."""
    return shape.judge(sf.Sources.from_texts(texts))


def blob_verdict(texts: Texts) -> str:
    """The verdict the one catalog gives the tree's three files by their blob ids."""
    known = catalog.load_catalog(paths.PATCHES_ROOT)
    blobs = {f: git_blob_id(as_bytes(texts[f])) for f in known.files}
    found = known.lookup(blobs)  # type: ignore[arg-type]
    assert found, "the files are no release or step the catalog knows"
    prs = found[0].fixes
    fix_a, fix_b = (f"sgl-project/sglang#{REGISTRY.fixes[f].pr}" for f in ("fix-a", "fix-b"))
    return shape.FIXED if fix_b in prs else shape.FIX_A_ONLY if fix_a in prs else shape.AFFECTED


def as_bytes(data: bytes | str | None) -> bytes:
    assert data is not None
    return data.encode() if isinstance(data, str) else data


def text_of(judgement: shape.Judgement) -> str:
    return "\n".join(judgement.lines())


@pytest.fixture(scope="module")
def latest_texts() -> Texts:
    """0.5.23's files: the newest release releases.toml pins a wheel of."""
    pin = REGISTRY.known["0.5.23"].wheel
    assert pin is not None
    return wheel_texts(pin)


@pytest.fixture(scope="module")
def patched_texts(patched_tree: Path) -> Texts:
    return texts_of(patched_tree)


def edited(texts: Texts, *edits: tuple[Path, str, str]) -> Texts:
    """A copy of texts with each (file, old, new): old, found once, made new."""
    texts = dict(texts)
    for path, old, new in edits:
        source = as_bytes(texts[str(path)]).decode()
        assert source.count(old) == 1, f"{old!r} is not once in {path}: the code moved"
        texts[str(path)] = source.replace(old, new)
    return texts


def moved(texts: Texts, name: str) -> Texts:
    """A copy of texts whose decode.py method `name` now lives in a mixin module of its own."""
    texts = dict(texts)
    source = as_bytes(texts[str(DECODE)]).decode()
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
    texts[str(DECODE)] = "".join(lines[:start] + lines[method.end_lineno :])
    texts[str(DECODE.with_name("prebuilt_fork.py"))] = f"class PrebuiltForkMixin:\n{body}"
    return texts


# release -> its base tree's texts; a step's tree differs from it only in the files its
# series touches (apply refuses a patch that touches any other)
BASE_TEXTS: dict[str, Texts] = {}


@pytest.mark.parametrize(("release", "step"), SERVED)
def test_every_served_step_is_judged_as_its_blob_ids_say(release: str, step: str) -> None:
    tree = STEPS / release / step
    if not (tree / "python" / "sglang").is_dir():
        pytest.skip(f"needs {tree}: run scripts/run-tests once")
    if step == "base":  # the folder itself, and its texts for the release's steps
        judged = shape.judge_tree(tree)
        BASE_TEXTS[release] = texts = texts_of(tree)
    else:
        texts = dict(BASE_TEXTS.get(release) or texts_of(STEPS / release / "base"))
        texts.update((f, (tree / f).read_bytes()) for f in shape_files(release))
        judged = judge(texts)
    assert judged.verdict == blob_verdict(texts), text_of(judged)


def shape_files(release: str) -> list[str]:
    """The files the release's series touches."""
    return series_for_release(paths.PATCHES_ROOT, release).manifest.files


def test_the_release_before_the_race_is_another_design() -> None:
    judged = judge(wheel_texts(BEFORE_THE_RACE))
    assert judged.verdict == shape.OTHER_DESIGN, text_of(judged)
    assert "FutureMap.alloc_future_indices: fresh future slots" in text_of(judged)


@SESSION_TREES
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


@SESSION_TREES
@pytest.mark.parametrize("condition", CONDITIONS.values(), ids=CONDITIONS.keys())
def test_a_wait_under_a_condition_is_not_fix_b(patched_texts: Texts, condition: str) -> None:
    new = IF_OVERLAP.replace("self.enable_overlap:", f"self.enable_overlap and {condition}:")
    judged = judge(edited(patched_texts, (DECODE, IF_OVERLAP, new)))
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
    # an event: full when this function recorded it on the forward stream on every way here
    "an event recorded on the forward stream": (
        WAIT,
        "            done = torch.cuda.Event()\n"
        "            done.record(self.forward_stream)\n"
        "            self.schedule_stream.wait_event(done)\n",
        shape.FIXED,
    ),
    "an event recorded under `with` the forward stream": (
        WAIT,
        "            with torch.cuda.stream(self.forward_stream):\n"
        "                done = self.forward_done\n"
        "                done.record()\n"
        "            self.schedule_stream.wait_event(done)\n",
        shape.FIXED,
    ),
    "an event recorded on the schedule stream": (
        WAIT,
        "            done = torch.cuda.Event()\n"
        "            done.record()\n"
        "            self.schedule_stream.wait_event(done)\n",
        shape.AFFECTED,
    ),
    "an event recorded on the forward stream on one way only": (
        WAIT,
        "            if len(can_run_list) == 1:\n"
        "                self.done.record(self.forward_stream)\n"
        "            self.schedule_stream.wait_event(self.done)\n",
        shape.AFFECTED,
    ),
    "an event recorded on the forward stream, then the schedule stream": (
        WAIT,
        "            self.done.record(self.forward_stream)\n"
        "            self.done.record(self.schedule_stream)\n"
        "            self.schedule_stream.wait_event(self.done)\n",
        shape.AFFECTED,
    ),
    "an event recorded on the forward stream, then a new one under its name": (
        WAIT,
        "            self.done.record(self.forward_stream)\n"
        "            self.done = torch.cuda.Event()\n"
        "            self.schedule_stream.wait_event(self.done)\n",
        shape.AFFECTED,
    ),
    "the forward stream waits on the forward stream's event": (
        WAIT,
        "            self.done.record(self.forward_stream)\n"
        "            self.forward_stream.wait_event(self.done)\n",
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
    "a second seeding off the prebuilt path": (
        "    def process_decode_queue(self: Scheduler):\n",
        "    def prebuilt_fast_path(self: Scheduler, new_batch):\n"
        "        new_batch.prepare_for_prebuilt()\n"
        "        new_batch.process_prebuilt(self.server_args, self.future_map)\n\n"
        "    def process_decode_queue(self: Scheduler):\n",
        shape.CANNOT_TELL,
    ),
    # the current stream's wait, where a `with` makes another stream current
    "the current stream under the forward stream": (
        WAIT,
        "            with torch.cuda.stream(self.forward_stream):\n"
        "                torch.cuda.current_stream().wait_stream(self.forward_stream)\n",
        shape.AFFECTED,
    ),
    "the current stream under the schedule stream": (
        WAIT,
        "            with torch.cuda.stream(self.schedule_stream):\n"
        "                torch.cuda.current_stream().wait_stream(self.forward_stream)\n",
        shape.FIXED,
    ),
    "the current stream under a stream of another name": (
        WAIT,
        "            with torch.cuda.stream(self.side_stream):\n"
        "                torch.cuda.current_stream().wait_stream(self.forward_stream)\n",
        shape.CANNOT_TELL,
    ),
}


@SESSION_TREES
@pytest.mark.parametrize("old, new, verdict", FORKS.values(), ids=FORKS.keys())
def test_a_fork_is_judged_as_a_person_would(
    patched_texts: Texts, old: str, new: str, verdict: str
) -> None:
    judged = judge(edited(patched_texts, (DECODE, old, new)))
    assert judged.verdict == verdict, text_of(judged)


# FutureMap's consumer side (S2), as publish and resolve_seq_lens_cpu of the patched
# 0.5.15.post1 hold it: the write, then the event recorded; the wait before the read.
WRITE = "        self.new_seq_lens_buf[indices] = new_seq_lens.to(self.new_seq_lens_buf.dtype)\n"
RECORD = (
    "            if self.publish_ready is None:\n"
    "                self.publish_ready = torch.get_device_module(self.device).Event()\n"
    "            self.publish_ready.record()\n"
)
CUDA_WAIT = "            else:\n                self.publish_ready.wait()\n"
CONSUMER_SIDES = {
    "the event recorded before the write": [(WRITE, ""), (RECORD, RECORD + "    " + WRITE)],
    "the event recorded only as it is made": [
        (RECORD, RECORD.replace("    self.publish_ready.r", "        self.publish_ready.r"))
    ],
    "the CUDA branch's wait gone": [(CUDA_WAIT, "            else:\n                pass\n")],
}


@SESSION_TREES
@pytest.mark.parametrize("edits", CONSUMER_SIDES.values(), ids=CONSUMER_SIDES.keys())
def test_fix_b_with_a_consumer_side_no_release_has_cannot_be_told(
    patched_texts: Texts, edits: list[tuple[str, str]]
) -> None:
    """The seeding ordered, but a consumer waiting on publish_ready may read rows before
    their write (race-check: S2 red): never fixed."""
    judged = judge(edited(patched_texts, *((Path(shape.OVERLAP), old, new) for old, new in edits)))
    assert judged.verdict == shape.CANNOT_TELL, text_of(judged)
    assert "a consumer may read rows before their write (S2)" in judged.reason, text_of(judged)


@SESSION_TREES
def test_a_wait_on_every_branch_of_an_unknown_condition_is_fix_b(patched_texts: Texts) -> None:
    branches = IF_OVERLAP.replace("self.enable_overlap", "len(can_run_list) > 1")
    tree = edited(
        patched_texts,
        (DECODE, IF_OVERLAP, branches),
        (DECODE, WAIT, WAIT + "        else:\n" + WAIT),
    )
    judged = judge(tree)
    assert judged.verdict == shape.FIXED, text_of(judged)


@SESSION_TREES
def test_a_wait_only_before_prepare_cannot_be_told(patched_texts: Texts) -> None:
    tree = edited(
        patched_texts,
        (DECODE, WAIT, WAIT_GONE),
        (
            DECODE,
            PREPARE,
            "        self.schedule_stream.wait_stream(self.forward_stream)\n" + PREPARE,
        ),
    )
    judged = judge(tree)
    assert judged.verdict == shape.CANNOT_TELL, text_of(judged)
    assert "with the ordering before prepare_for_prebuilt(), not after it" in judged.reason


@SESSION_TREES
def test_a_function_moved_to_another_module_is_followed(
    patched_texts: Texts, session_step_trees: dict[str, Path]
) -> None:
    fixed = judge(moved(patched_texts, shape.ENTRY))
    assert fixed.verdict == shape.FIXED, text_of(fixed)
    assert "srt/disaggregation/prebuilt_fork.py:" in text_of(fixed)
    unpatched = moved(texts_of(session_step_trees["base"]), shape.ENTRY)
    assert judge(unpatched).verdict == shape.AFFECTED


def test_0_5_23s_helper_moved_away_is_followed_and_its_wait_removed_is_not(
    latest_texts: Texts,
) -> None:
    tree = moved(latest_texts, "_get_new_prebuilt_batch")
    judged = judge(tree)
    assert judged.verdict == shape.FIXED, text_of(judged)
    assert "prebuilt_fork.py:" in text_of(judged)
    assert "(another module)" in text_of(judged)
    no_wait = edited(latest_texts, (DECODE, WAIT, WAIT_GONE))
    judged = judge(no_wait)
    assert judged.verdict == shape.AFFECTED, text_of(judged)
    assert judged.reason.startswith("SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch")


@SESSION_TREES
def test_what_cannot_be_read_is_said(patched_texts: Texts) -> None:
    renamed = edited(
        patched_texts,
        (DECODE, "    def get_new_prebuilt_batch(", "    def get_next_prebuilt_batch("),
    )
    judged = judge(renamed)
    assert (judged.verdict, judged.reason) == (
        shape.CANNOT_TELL,
        "get_new_prebuilt_batch is in no file of the tree (moved out of it, or renamed)",
    )
    missing = {path: text for path, text in patched_texts.items() if path != shape.DECODE}
    judged = judge(missing)
    assert (judged.verdict, judged.reason) == (shape.CANNOT_TELL, f"{shape.DECODE} is missing")
    broken = edited(patched_texts, (DECODE, PREPARE, PREPARE + "        if (:\n"))
    judged = judge(broken)
    assert judged.reason.startswith(f"{shape.DECODE} does not parse:"), text_of(judged)


@SESSION_TREES
def test_futuremap_moved_is_followed_and_missing_is_said(patched_texts: Texts) -> None:
    tree = dict(patched_texts)
    future_map = str(Path(shape.OVERLAP).with_name("future_map.py"))
    tree[future_map] = tree.pop(shape.OVERLAP)
    judged = judge(tree)
    assert judged.verdict == shape.FIXED, text_of(judged)
    assert "srt/managers/future_map.py:" in text_of(judged)
    del tree[future_map]
    judged = judge(tree)
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
