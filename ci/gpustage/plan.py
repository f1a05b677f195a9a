"""The stages of the online and the offline GPU pipeline, for one series."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from patchset import paths
from patchset.errors import BackportError
from patchset.manifest import Series
from testrun.outcomes import OPTION as OUTCOMES_OPTION
from testrun.steps import PATCH_SET_ENV, STEP_ENV, TREE_ENV

from . import contract, evidence, layout
from . import facts as machine
from . import wheelhouse as wh
from .stages import CPU, GPU, Stage, judge_bench, judge_gpu_step, judge_with_warnings, rel

ROOT = paths.PROJECT_ROOT
GPU_TEST = ROOT / "test" / "steps" / "test_gpu_prebuilt_race.py"
BENCH = ROOT / "ci" / "bench_wait_stream.py"
TEST_PINS = ROOT / "ci" / "requirements-gpu-test.txt"
RUN_TESTS = ROOT / "scripts" / "run-tests"
RACE_CHECK = ROOT / "scripts" / "race-check"
APPLY = ROOT / "scripts" / "apply-patches"
VENV_PYTHON = "3.11"  # the online venv installs the cp311 wheel with its dependencies
LONG_S1_ITERATIONS = 1000  # the fixed step's long run, beside every step's 200
CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
# The least time each kind of GPU stage needs on an H200 (imports, S1, the CSAN
# child), said so that a deadline skips a stage rather than cutting it short.
BUDGET_S = {"step": 45.0, "long": 40.0, "control": 30.0, "bench": 45.0}


@dataclass
class Options:
    series: Series
    reports: Path
    bench_runs: int
    python: str
    venv: Path | None = None  # online
    wheelhouse: wh.Wheelhouse | None = None  # offline
    wheelhouse_dir: Path | None = None
    site: Path | None = None
    step_files: Path | None = None  # offline: the carried touched files of each step
    trees: Path | None = None  # offline: where the git-less step trees are laid out
    rehearse: bool = False
    any_torch: bool = False

    @property
    def requirements(self) -> Path:
        """The hash-pinned requirements the offline install reads (written by main)."""
        assert self.site is not None
        return self.site.parent / "gpu-site-requirements.txt"


def _lib(code: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); {code}",
    ]


def python_version_of(exe: str) -> str | None:
    found = shutil.which(exe) or (exe if Path(exe).is_file() else None)
    if found is None:
        return None
    result = subprocess.run(
        [found, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
    )
    return result.stdout.strip() or None


def preflight(python: str, version: str, need_gpu: bool) -> Callable[[], tuple[bool, str]]:
    def check() -> tuple[bool, str]:
        found = python_version_of(python)
        if found is None:
            return False, f"FAIL: {python} not found; pass --python with a Python {version}"
        if found != version:
            return False, f"FAIL: {python} is Python {found}; this run needs {version}"
        if not need_gpu:
            return True, f"ok: Python {found}; rehearsal: no GPU needed"
        if shutil.which("nvidia-smi") is None:
            return False, "FAIL: nvidia-smi not found: no NVIDIA driver on this machine"
        gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        lines = gpus.stdout.strip().splitlines()
        if gpus.returncode != 0 or not lines:
            return False, f"FAIL: nvidia-smi -L found no GPU ({gpus.stderr.strip()})"
        return True, f"ok: Python {found}; {lines[0]}"

    return check


def _layout(opts: Options, env: dict[str, str]) -> Stage:
    manifest = opts.series.manifest
    version = manifest.base.version
    return Stage(
        "apply",
        f"apply the series to the build tree, lay out build/steps/{version}/"
        + "{"
        + ",".join(manifest.steps)
        + "}",
        [
            sys.executable,
            str(APPLY),
            "--patch-set",
            str(opts.series.folder),
            "&&",
            *_lib(
                "from patchset import buildtree, paths, manifest; "
                f"s = manifest.series_for_release(paths.PATCHES_ROOT, {version!r}); "
                "[print(k, v) for k, v in buildtree.step_trees(s, paths.build_dir()).items()]"
            ),
        ],
        env=env,
    )


def _step_tree(opts: Options, step: str) -> Path:
    if opts.trees is not None:
        return layout.tree_path(opts.trees, opts.series, step) / "python"
    return paths.build_dir() / "steps" / opts.series.manifest.base.version / step / "python"


def _pytest_stage(
    opts: Options,
    name: str,
    step: str,
    purpose: str,
    shown: str,
    python: str,
    extra_path: list[str],
    needs: tuple[str, ...],
    budget_s: float,
    select: str | None = None,
    env: dict[str, str] | None = None,
) -> Stage:
    """pytest on the GPU test file against one step's tree, judged by judge_gpu_step.

    The image's pytest plugins stay out (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1); the
    one plugin the run needs, testrun.outcomes, is named with -p.
    """
    tree = _step_tree(opts, step)
    report = opts.reports / f"{name}.json"
    stage_env = {
        "PYTHONPATH": os.pathsep.join([str(tree), *extra_path, str(ROOT / "scripts")]),
        STEP_ENV: step,
        PATCH_SET_ENV: str(opts.series.folder),
        TREE_ENV: str(tree.parent),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        **(env or {}),
    }
    if opts.rehearse:  # imports as on the lent machine: is_cuda() True, no sgl_kernel
        stage_env[contract.PLAY_CUDA_ENV] = "1"
    else:
        stage_env[contract.REQUIRE_CUDA_ENV] = "1"
    return Stage(
        name,
        purpose,
        [
            python,
            "-m",
            "pytest",
            str(GPU_TEST),
            "--rootdir",
            str(ROOT),
            "-p",
            "testrun.outcomes",
            "-p",
            "no:cacheprovider",
            "-rA",
            *(["-k", select] if select else []),
            f"--junitxml={report.with_suffix('.xml')}",
            OUTCOMES_OPTION,
            str(report),
        ],
        kind=GPU,
        env=stage_env,
        needs=needs,
        judge=judge_gpu_step(report, shown, rehearsal=opts.rehearse),
        budget_s=budget_s,
    )


def _gpu_and_bench(
    opts: Options, python: str, extra_path: list[str], needs: tuple[str, ...]
) -> list[Stage]:
    """Per step S1 and CSAN, the fixed step's long run, the two controls, the benchmark."""
    manifest = opts.series.manifest
    base, final = manifest.steps[0], manifest.final_step

    def stage(
        name: str,
        step: str,
        purpose: str,
        shown: str,
        budget: str,
        select: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Stage:
        return _pytest_stage(
            opts, name, step, purpose, shown, python, extra_path, needs, BUDGET_S[budget],
            select, env,
        )  # fmt: skip

    stages = [
        stage(
            f"gpu-{step}",
            step,
            f"S1 ({contract.S1_MIN_ITERATIONS} iterations) and CSAN on CUDA against step {step}"
            + (" (must pass)" if step == final else " (must show the known failure)"),
            "fix holds" if step == final else "known failure shown",
            "step",
        )
        for step in manifest.steps
    ]
    if opts.rehearse:
        return stages  # the long run, the controls and the benchmark hold only CUDA work
    stages += [
        stage(
            f"gpu-{final}-long",
            final,
            f"S1 with {LONG_S1_ITERATIONS} iterations against step {final} (must pass)",
            "fix holds",
            "long",
            select="test_seed_survives_the_in_flight_forward",
            env={contract.S1_ITERATIONS_ENV: str(LONG_S1_ITERATIONS)},
        ),
        stage(
            "control-sleep-0",
            base,
            f"control: S1 against step {base} with the forward not held back (sleep 0): "
            "the seed wins, the race needs a late forward",
            "seed wins without the hold-back",
            "control",
            select="test_without_the_hold_back_the_seed_wins",
            env={contract.NO_SLEEP_ENV: "1"},
        ),
        stage(
            "control-1",
            base,
            f"control: S1 against step {base} with {CONNECTIONS}=1 (one hardware queue) "
            "hides the race",
            "race hidden",
            "control",
            select="test_one_hardware_queue_hides_the_race",
            env={CONNECTIONS: "1"},
        ),
    ]
    bench_json = opts.reports / evidence.BENCH_FILE
    final_tree = _step_tree(opts, final)
    stages.append(
        Stage(
            "bench",
            "what 0002's wait_stream costs per prebuilt batch: the wait itself and the "
            "idle gap, each as a share of a decode step",
            [python, str(BENCH), "--runs", str(opts.bench_runs), "--json", str(bench_json)],
            kind=GPU,
            env={"PYTHONPATH": os.pathsep.join([str(final_tree), *extra_path])},
            needs=needs,
            judge=judge_bench(bench_json),
            budget_s=BUDGET_S["bench"],
        )
    )
    return stages


def online(opts: Options) -> list[Stage]:
    assert opts.venv is not None
    manifest = opts.series.manifest
    wheel = paths.cache_dir() / manifest.base.wheel
    vpy = str(opts.venv / "bin" / "python")
    stages = [
        Stage(
            "preflight",
            f"Python {VENV_PYTHON} for the venv and a CUDA GPU are present",
            [opts.python, "--version", "&&", "nvidia-smi", "-L"],
            action=preflight(opts.python, VENV_PYTHON, need_gpu=True),
        ),
        Stage(
            "fetch-wheel",
            f"download (or take from the cache) {manifest.base.wheel}, sha256 "
            f"{manifest.base.sha256[:12]}..., checked against pin.toml",
            _lib(
                "from patchset import paths, wheel, manifest; "
                f"s = manifest.series_for_release(paths.PATCHES_ROOT, {manifest.base.version!r}); "
                "print(wheel.fetch_wheel(s.manifest.base, paths.cache_dir()))"
            ),
        ),
        Stage(
            "venv",
            f"a fresh virtual environment in {rel(opts.venv)} (an old one is removed)",
            [opts.python, "-m", "venv", "--clear", str(opts.venv)],
            needs=("preflight",),
        ),
        Stage(
            "install",
            "the pinned wheel with its full dependencies (its own CUDA torch), and pytest",
            [
                vpy,
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                str(wheel),
                "-r",
                str(TEST_PINS),
            ],
            needs=("fetch-wheel", "venv"),
        ),
        Stage(
            "cuda-check",
            "torch in the venv sees a CUDA device",
            [
                vpy,
                "-c",
                'import torch; assert torch.cuda.is_available(), "torch sees no CUDA '
                'device"; print(torch.__version__, "CUDA", torch.version.cuda, '
                "torch.cuda.get_device_name())",
            ],
            needs=("install",),
        ),
        _facts(opts, vpy, ("cuda-check",)),
        _layout(opts, {}),
    ]
    for script, extra, name, purpose in (
        (
            RUN_TESTS,
            [],
            "unit-tests",
            "the CPU gate, GPU hidden: tools tests once, step tests per step",
        ),
        (RACE_CHECK, ["--step", "all"], "race-check", "the CPU happens-before checker, GPU hidden"),
    ):
        stages.append(
            Stage(
                name,
                purpose,
                [sys.executable, str(script), *extra],
                kind=CPU,
                missing=None if script.is_file() else f"{rel(script)} is not in this checkout",
            )
        )
    return stages + _gpu_and_bench(opts, vpy, [], ("cuda-check", "apply"))


TORCH_CHECK = (
    "import sys, torch, torchvision; v = torch.__version__.split('+')[0]; "
    "print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'torchvision', "
    "torchvision.__version__); want = sys.argv[1]; "
    "ok = v == want or sys.argv[2] == 'any'; "
    "print(('ok: ' if v == want else 'WARNING: ' if ok else 'FAIL: ') + "
    "f'the base pins torch {want}, the runner has {v}'); sys.exit(0 if ok else 3)"
)
CUDA_CHECK = (
    "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'; "
    "print('CUDA device:', torch.cuda.get_device_name())"
)


def offline(opts: Options) -> list[Stage]:
    assert opts.wheelhouse_dir is not None and opts.site is not None
    manifest = opts.series.manifest
    house = opts.wheelhouse
    version = house.python_version if house else "of the wheelhouse"
    requirements = opts.requirements
    torch_pin = manifest.release.torch or "?"
    stages = [
        Stage(
            "preflight",
            f"Python {version} and "
            + ("no GPU (rehearsal)" if opts.rehearse else "a CUDA GPU")
            + " are present",
            [opts.python, "--version"] + ([] if opts.rehearse else ["&&", "nvidia-smi", "-L"]),
            action=preflight(opts.python, version, need_gpu=not opts.rehearse),
        ),
        Stage(
            "torch-check",
            f"the runner's own torch is the base's pin ({torch_pin}) with a torchvision",
            [opts.python, "-c", TORCH_CHECK, torch_pin, "any" if opts.any_torch else "pinned"]
            + ([] if opts.rehearse else ["&&", opts.python, "-c", CUDA_CHECK]),
            needs=("preflight",),
            judge=judge_with_warnings,
        ),
        Stage(
            "install",
            f"only from the wheelhouse, hash-checked, into {rel(opts.site)}",
            [
                opts.python,
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-index",
                "--no-deps",
                "--require-hashes",
                "--find-links",
                str(opts.wheelhouse_dir),
                "--upgrade",
                "--target",
                str(opts.site),
                "-r",
                str(requirements),
            ],
            needs=("torch-check",),
        ),
        _facts(opts, opts.python, ("torch-check",)),
        _git_less_layout(opts),
    ]
    return stages + _gpu_and_bench(opts, opts.python, [str(opts.site)], ("install", "layout"))


def _facts(opts: Options, python: str, needs: tuple[str, ...]) -> Stage:
    return Stage(
        "facts",
        "the machine's facts into facts.json: nvidia-smi, clocks, torch, triton, git",
        [
            *("nvidia-smi", "&&", "nvidia-smi", f"--query-gpu={machine.CLOCKS}", "--format=csv"),
            *("&&", python, "-c", "import torch, triton", "&&", "command", "-v", "git"),
        ],
        needs=needs,
        action=lambda: machine.record(python, opts.reports),
    )


def _git_less_layout(opts: Options) -> Stage:
    assert opts.wheelhouse_dir is not None and opts.step_files is not None
    assert opts.trees is not None
    series, trees, step_files = opts.series, opts.trees, opts.step_files
    wheel = opts.wheelhouse_dir / series.manifest.base.wheel

    def lay_out() -> tuple[bool, str]:
        try:
            laid = layout.lay_out(series, wheel, step_files, trees)
        except BackportError as err:
            print(f"error: {err}", file=sys.stderr)
            return False, f"FAIL: {err.problem}"
        return True, f"ok: {', '.join(laid)} laid out, {len(series.manifest.files)} blob ids each"

    return Stage(
        "layout",
        f"the step trees in {rel(trees)} without git: the wheelhouse's sglang wheel, each "
        f"step's touched files from {rel(step_files)}, every blob id checked against pin.toml",
        _lib(  # what the action runs in-process
            f"sys.path.insert(0, {str(ROOT / 'ci')!r}); from pathlib import Path; "
            "from gpustage import layout; from patchset.manifest import Series; "
            f"layout.lay_out(Series.load(Path({str(series.folder)!r})), Path({str(wheel)!r}), "
            f"Path({str(step_files)!r}), Path({str(trees)!r}))"
        ),
        needs=("preflight",),
        action=lay_out,
    )


def facts(opts: Options, offline_mode: bool) -> dict[str, str]:
    manifest = opts.series.manifest
    shown = {
        "repository": str(ROOT),
        "base": f"sglang {manifest.base.version}, steps {', '.join(manifest.steps)}",
        "python": opts.python,
        "reports": str(opts.reports),
    }
    if offline_mode:
        house = opts.wheelhouse
        shown["wheelhouse"] = str(opts.wheelhouse_dir) + (
            f" (Python {house.python_version}, {len(house.entries)} wheels, "
            f"{house.total_bytes / 2**20:.1f} MiB, hashes checked)"
            if house
            else " (MISSING: a real run refuses)"
        )
        shown["site"] = str(opts.site)
        shown["step files"] = f"{opts.step_files} (blob ids checked against pin.toml)"
        shown["step trees"] = str(opts.trees)
    else:
        shown["venv"] = str(opts.venv)
        shown["wheel"] = str(paths.cache_dir() / manifest.base.wheel)
    return shown
