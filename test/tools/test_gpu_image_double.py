"""The rehearsal's double of the lent machine's image fails where the lent machine would.

Each test runs something on the double (ci/gpustage/wheelhouse.py: Python 3.12
with the image's packages only, sgl_kernel absent) with the GPU stages' CUDA
played, and shows one defect that a rehearsal on our test environment let
through: a call-time import of a module that needs sgl_kernel (D1), the CSAN
child that loses the stage's site (D2), and a wheel missing from the wheelhouse.
The defects are put back into a scratch copy of the project (the files under
test are never edited in place); the same run on the real files is the
rehearsal of `.ci/run`, which passes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from xml.etree import ElementTree

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci"))

from gpustage import contract, layout, plan, stages, wheelhouse  # noqa: E402
from patchset import paths  # noqa: E402
from patchset.lint import series_sha256  # noqa: E402
from patchset.manifest import Series, sha256_of  # noqa: E402
from testrun import venv  # noqa: E402
from testrun.outcomes import FAIL, PASS, read_outcomes  # noqa: E402

# The two defects, as the files had them before the fix: (file, fixed text, old text).
OLD_CODE = (
    (
        "ci/gpustage/sglang_import.py",
        "        for name in sorted(set().union(*call_time_imports().values())):\n"
        "            modules.setdefault(name, importlib.import_module(name))\n",
        "",
    ),
    (
        "test/steps/test_gpu_prebuilt_race.py",
        "env.update(PYTHONPATH=child_pythonpath(tree, os.environ), ",
        "env.update(PYTHONPATH=tree, ",
    ),
)
D1_TEST = "test_call_time_imports_need_no_sgl_kernel"
D1_DYNAMIC_TEST = "test_rig_runs_the_real_path_on_the_cpu_device"
D2_TEST = "test_csan_child_imports_as_a_plain_script"
# passes on the old code too: the whole site imports the rig's modules on the double
IMPORTS_TEST = "test_path_under_test_reads_no_other_cuda_flag"
REMOVED_WHEEL = "orjson"  # imported by sglang's closure; not in the image


@pytest.fixture(scope="module")
def double() -> Path:
    return wheelhouse.ensure_double()


@pytest.fixture(scope="module")
def rehearsal_options(
    tmp_path_factory: pytest.TempPathFactory, series: Series, wheel_cache: Path, double: Path
) -> plan.Options:
    """What the rehearsal has before its GPU stages: the 3.12 wheelhouse installed into a
    site, the step trees laid out without git, the double as the runner's Python."""
    work = tmp_path_factory.mktemp("image-double")
    manifest = series.manifest
    house_dir = paths.cache_dir() / "test-wheelhouse" / f"py{wheelhouse.DOUBLE_PYTHON}"
    wheelhouse.build(manifest, wheelhouse.DOUBLE_PYTHON, house_dir, wheel_cache)
    house = wheelhouse.load(house_dir, manifest)
    # The site, made once per content (the double and the hashed requirements) in the
    # cache folder and only read here: its install and bytecode compile take 12 CPU-s.
    key = hashlib.sha256(f"{double}\n{house.requirements()}".encode()).hexdigest()[:16]
    made = paths.cache_dir() / "test-site" / f"py{wheelhouse.DOUBLE_PYTHON}-{key}"
    opts = plan.Options(
        series=series,
        reports=work / "reports",
        bench_runs=2,
        python=str(double),
        wheelhouse=house,
        wheelhouse_dir=house_dir,
        site=made / "site",
        step_files=work / "step-files",
        trees=trees_of(series, house_dir / manifest.base.wheel),
        rehearse=True,
    )
    opts.reports.mkdir()
    layout.write_step_files(series, house_dir / manifest.base.wheel, opts.step_files)
    if not opts.trees.is_dir():
        lay_out = partial(layout.lay_out, series, house_dir / manifest.base.wheel, opts.step_files)
        venv.make_aside(opts.trees, opts.trees, lay_out)

    def install_site(aside: Path) -> None:
        # uv instead of the stage's pip (22 s): the same wheels, hash-checked
        requirements = aside / opts.requirements.name
        aside.mkdir()
        requirements.write_text(house.requirements(), encoding="utf-8")
        install = [str(venv.uv_binary()), "pip", "install", "--quiet", "--no-index"]
        install += ["--no-deps", "--compile-bytecode"]  # this machine sets PYTHONDONTWRITEBYTECODE
        install += ["--require-hashes", "--find-links", str(house_dir), "--python", str(double)]
        install += ["--target", str(aside / "site"), "-r", str(requirements)]
        env = {**os.environ, "UV_CACHE_DIR": str(paths.cache_dir() / "uv-cache")}
        result = subprocess.run(install, capture_output=True, text=True, env=env)
        assert result.returncode == 0, result.stdout + result.stderr

    if not opts.site.is_dir():
        venv.make_aside(made, opts.site, install_site)
    return opts


def trees_of(series: Series, wheel: Path) -> Path:
    """Where the step trees are laid out once per content (the wheel, the series, the
    layout code) in the cache folder; the stage keeps its bytecode there: sglang's
    modules compiled again in each fresh tree cost the stage about 2 CPU-s."""
    facts = [sha256_of(wheel), series_sha256(series.manifest), Path(layout.__file__).read_text()]
    key = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]
    return paths.cache_dir() / "test-trees" / f"py{wheelhouse.DOUBLE_PYTHON}-{key}"


def _scratch_project(dest: Path) -> Path:
    """The files a GPU stage runs, copied, with the two defects put back."""
    for part in ("ci", "scripts", "test/steps", "patches"):
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
    for file, fixed, old in OLD_CODE:
        path = dest / file
        text = path.read_text(encoding="utf-8")
        assert text.count(fixed) == 1, f"{file} no longer holds the fixed code: {fixed!r}"
        path.write_text(text.replace(fixed, old), encoding="utf-8")
    return dest


def _failures(junit_xml: Path) -> dict[str, str]:
    """test function -> its failure text, from pytest's JUnit XML."""
    found = {}
    for case in ElementTree.parse(junit_xml).iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            found[case.get("name", "")] = f"{failure.get('message', '')}\n{failure.text or ''}"
    return found


@pytest.fixture(scope="module")
def old_code_on_the_double(
    tmp_path_factory: pytest.TempPathFactory, rehearsal_options: plan.Options
) -> tuple[dict[str, str], dict[str, str]]:
    """The rehearsal's stage of the final step, on the double, run on the old code: each
    test's outcome and each failure's text."""
    opts = rehearsal_options
    scratch = _scratch_project(tmp_path_factory.mktemp("old-code"))
    final = f"gpu-{opts.series.manifest.final_step}"
    stage = next(s for s in plan.offline(opts) if s.name == final)
    moved = str(scratch)

    def move(word: str) -> str:
        return word.replace(str(ROOT), moved)

    stage.command = [move(w) for w in stage.command]
    stage.command += ["-k", " or ".join((D1_TEST, D1_DYNAMIC_TEST, D2_TEST, IMPORTS_TEST))]
    stage.env = {k: move(v) for k, v in stage.env.items()}
    stage.env["PYTHONDONTWRITEBYTECODE"] = ""  # empty: unset; see trees_of
    assert stage.env[contract.PLAY_CUDA_ENV] == "1", stage.env
    rc = stages.run_command(stage, opts.reports / f"{final}.log")
    report = opts.reports / f"{final}.json"
    assert report.is_file(), (rc, (opts.reports / f"{final}.log").read_text()[-3000:])
    return read_outcomes(report)[0], _failures(report.with_suffix(".xml"))


def _outcome(outcomes: dict[str, str], test: str) -> str:
    return next(o for name, o in outcomes.items() if name.endswith(f"::{test}"))


def test_the_double_fails_on_a_call_time_import_that_needs_sgl_kernel(
    old_code_on_the_double: tuple[dict[str, str], dict[str, str]],
) -> None:
    """D1: without the call-time imports in the window, spec_utils is imported at the
    first stash with is_cuda() played True, and sgl_kernel is not there."""
    outcomes, failures = old_code_on_the_double
    for test in (D1_TEST, D1_DYNAMIC_TEST):
        assert _outcome(outcomes, test) == FAIL, outcomes
        assert "No module named 'sgl_kernel'" in failures[test], failures.get(test)


def test_the_double_fails_on_a_csan_child_without_the_site(
    old_code_on_the_double: tuple[dict[str, str], dict[str, str]],
) -> None:
    """D2: the child with the step tree alone on PYTHONPATH cannot import sglang's
    closure on the image (our test environment holds it, so it passed there)."""
    outcomes, failures = old_code_on_the_double
    assert _outcome(outcomes, D2_TEST) == FAIL, outcomes
    assert "No module named" in failures[D2_TEST], failures.get(D2_TEST)


def _import_the_rig(opts: plan.Options, site: Path) -> subprocess.CompletedProcess[str]:
    """The rig's import on the double, CUDA played, as a GPU stage's process does it."""
    tree = layout.tree_path(opts.trees, opts.series, opts.series.manifest.final_step)
    code = (
        f"import sys; sys.path[:0] = [{str(ROOT / 'ci')!r}, {str(ROOT / 'scripts')!r}]; "
        "from gpustage import sglang_import; sglang_import.play_cuda(); "
        "sglang_import.import_modules(); print('imported')"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "python"), str(site)])}
    return subprocess.run(
        [opts.python, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )


def test_the_double_fails_on_a_wheel_missing_from_the_wheelhouse(
    tmp_path: Path,
    rehearsal_options: plan.Options,
    old_code_on_the_double: tuple[dict[str, str], dict[str, str]],
) -> None:
    """The site without one wheel of the wheelhouse (as if the wheelhouse had left it
    out) cannot import the rig's modules on the double; the whole site can (the GPU
    test file imported them there, and its import test passed)."""
    assert _outcome(old_code_on_the_double[0], IMPORTS_TEST) == PASS, old_code_on_the_double
    opts = rehearsal_options
    assert opts.site is not None
    removed = [p for p in opts.site.iterdir() if p.name.split("-")[0] == REMOVED_WHEEL]
    assert removed, f"the site holds no {REMOVED_WHEEL}"
    short = tmp_path / "site"
    short.mkdir()
    for entry in opts.site.iterdir():
        if entry not in removed:
            (short / entry.name).symlink_to(entry)
    without = _import_the_rig(opts, short)
    assert without.returncode != 0, without.stdout
    assert f"No module named '{REMOVED_WHEEL}'" in without.stderr, without.stderr[-3000:]
