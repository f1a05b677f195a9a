"""The stages of the online and the offline GPU pipeline, for one series."""

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from patchset import paths
from patchset.manifest import Series
from testrun.outcomes import OPTION as OUTCOMES_OPTION
from testrun.steps import PATCH_SET_ENV, STEP_ENV, TREE_ENV
from testrun.venv import PYTHON_VERSION

from . import contract, evidence, layout
from . import wheelhouse as wh
from .stages import CPU, GPU, Stage, judge_bench, judge_gpu_step, judge_with_warnings, rel

ROOT = paths.PROJECT_ROOT
SCRIPTS = str(ROOT / "scripts")
GPU_TEST = ROOT / "test" / "steps" / "test_gpu_prebuilt_race.py"
BENCH = ROOT / "ci" / "bench_wait_stream.py"
# the online venv installs the pinned wheel, built for the test environments' Python
VENV_PYTHON = ".".join(map(str, PYTHON_VERSION))
LONG_S1_ITERATIONS = 1000  # the fixed step's long run, beside every step's 200
CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
# The least time each kind of GPU stage needs on an H200: a deadline skips, not cuts, a stage.
BUDGET_S = {"step": 45.0, "long": 40.0, "control": 30.0, "bench": 45.0}
PIP_INSTALL = ["-m", "pip", "install", "--disable-pip-version-check"]
TORCH_CHECK = (
    "import sys, torch, torchvision; v = torch.__version__.split('+')[0]; "
    "print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'torchvision', "
    "torchvision.__version__); want = sys.argv[1]; ok = v == want or sys.argv[2] == 'any'; "
    "print(('ok: ' if v == want else 'WARNING: ' if ok else 'FAIL: ') + "
    "f'the base pins torch {want}, the runner has {v}'); sys.exit(0 if ok else 3)"
)
CUDA_CHECK = (
    "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'; "
    "print('CUDA device:', torch.cuda.get_device_name())"
)


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
        """The hash-pinned requirements the offline install reads (ci/run-gpu writes them)."""
        assert self.site is not None
        return self.site.parent / "gpu-site-requirements.txt"


def _lib(code: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {SCRIPTS!r}); {code}"]


def preflight(python: str, version: str, need_gpu: bool) -> tuple[bool, str]:
    if (found := evidence.python_version(python)) is None:
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


def _gpu_stages(opts: Options, python: str) -> list[Stage]:
    """S1 and CSAN per step, the long run, the controls, the bench; no plugins of the image."""
    extra_path = [] if opts.venv else [str(opts.site)]
    needs = ("cuda-check", "apply") if opts.venv else ("install", "layout")
    manifest = opts.series.manifest
    base, final = manifest.steps[0], manifest.final_step
    # an S1 stage's played or required CUDA: the rehearsal imports as on the lent machine
    cuda = contract.PLAY_CUDA_ENV if opts.rehearse else contract.REQUIRE_CUDA_ENV
    trees = opts.trees or paths.build_dir() / "steps"  # the git-less trees, else git's
    sglang_of = {s: layout.tree_path(trees, opts.series, s) / "python" for s in manifest.steps}

    def stage(
        name: str, step: str, purpose: str, shown: str, budget: str, select: str = "", **env: str
    ) -> Stage:
        tree = sglang_of[step]
        report = opts.reports / f"{name}.json"
        command = [python, "-m", "pytest", str(GPU_TEST), "--rootdir", str(ROOT)]
        command += ["-p", "testrun.outcomes", "-p", "no:cacheprovider", "-rA"]
        command += ["-k", select] if select else []
        command += [f"--junitxml={report.with_suffix('.xml')}", OUTCOMES_OPTION, str(report)]
        stage_env = {
            "PYTHONPATH": os.pathsep.join([str(tree), *extra_path, SCRIPTS]),
            STEP_ENV: step,
            PATCH_SET_ENV: str(opts.series.folder),
            TREE_ENV: str(tree.parent),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            **env,
            cuda: "1",
        }
        judge = partial(judge_gpu_step, report, shown, opts.rehearse)
        return Stage(name, purpose, command, GPU, stage_env, needs, judge, None, BUDGET_S[budget])

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
    bench_json = opts.reports / evidence.BENCH_FILE
    return [
        *stages,
        stage(
            f"gpu-{final}-long",
            final,
            f"S1 with {LONG_S1_ITERATIONS} iterations against step {final} (must pass)",
            "fix holds",
            "long",
            "test_seed_survives_the_in_flight_forward",
            **{contract.S1_ITERATIONS_ENV: str(LONG_S1_ITERATIONS)},
        ),
        stage(
            "control-sleep-0",
            base,
            f"control: S1 against step {base} with the forward not held back (sleep 0): "
            "the seed wins, the race needs a late forward",
            "seed wins without the hold-back",
            "control",
            "test_without_the_hold_back_the_seed_wins",
            **{contract.NO_SLEEP_ENV: "1"},
        ),
        stage(
            "control-1",
            base,
            f"control: S1 against step {base} with {CONNECTIONS}=1 (one hardware queue) "
            "hides the race",
            "race hidden",
            "control",
            "test_one_hardware_queue_hides_the_race",
            **{CONNECTIONS: "1"},
        ),
        Stage(
            "bench",
            "what 0002's wait_stream costs per prebuilt batch: the wait itself and the "
            "idle gap, each as a share of a decode step",
            [python, str(BENCH), "--runs", str(opts.bench_runs), "--json", str(bench_json)],
            GPU,
            {"PYTHONPATH": os.pathsep.join([str(sglang_of[final]), *extra_path])},
            needs,
            partial(judge_bench, bench_json),
            budget_s=BUDGET_S["bench"],
        ),
    ]


def online(opts: Options) -> list[Stage]:
    assert opts.venv is not None
    manifest = opts.series.manifest
    version = manifest.base.version
    vpy, wheel = str(opts.venv / "bin" / "python"), str(paths.cache_dir() / manifest.base.wheel)
    cuda_check = (
        'import torch; assert torch.cuda.is_available(), "torch sees no CUDA device"; '
        'print(torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name())'
    )
    series = f"s = manifest.series_for_release(paths.PATCHES_ROOT, {version!r}); "
    trees = "{" + ",".join(manifest.steps) + "}"
    return [
        Stage(
            "preflight",
            f"Python {VENV_PYTHON} for the venv and a CUDA GPU are present",
            [opts.python, "--version", "&&", "nvidia-smi", "-L"],
            action=partial(preflight, opts.python, VENV_PYTHON, need_gpu=True),
        ),
        Stage(
            "fetch-wheel",
            f"download (or take from the cache) {manifest.base.wheel}, sha256 "
            f"{manifest.base.sha256[:12]}..., checked against pin.toml",
            _lib(
                f"from patchset import paths, wheel, manifest; {series}"
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
            [vpy, *PIP_INSTALL, wheel, "-r", str(wh.TEST_PINS)],
            needs=("fetch-wheel", "venv"),
        ),
        Stage(
            "cuda-check",
            "torch in the venv sees a CUDA device",
            [vpy, "-c", cuda_check],
            needs=("install",),
        ),
        _facts(opts, vpy, ("cuda-check",)),
        Stage(
            "apply",
            f"apply the series to the build tree, lay out build/steps/{version}/{trees}",
            [
                *(sys.executable, str(ROOT / "scripts" / "apply-patches")),
                *("--patch-set", str(opts.series.folder), "&&"),
                *_lib(
                    f"from patchset import buildtree, paths, manifest; {series}"
                    "[print(k, v) for k, v in buildtree.step_trees(s, paths.build_dir()).items()]"
                ),
            ],
        ),
        Stage(
            "unit-tests",
            "the CPU gate, GPU hidden: tools tests once, step tests per step",
            [sys.executable, str(ROOT / "scripts" / "run-tests")],
            CPU,
        ),
        Stage(
            "race-check",
            "the CPU happens-before checker, GPU hidden",
            [sys.executable, str(ROOT / "scripts" / "race-check"), "--step", "all"],
            CPU,
        ),
        *_gpu_stages(opts, vpy),
    ]


def offline(opts: Options) -> list[Stage]:
    assert opts.wheelhouse_dir and opts.site and opts.step_files and opts.trees
    series, trees, step_files = opts.series, opts.trees, opts.step_files
    wheel = opts.wheelhouse_dir / series.manifest.base.wheel

    def lay_out() -> tuple[bool, str]:
        laid = layout.lay_out(series, wheel, step_files, trees)
        return True, f"ok: {', '.join(laid)} laid out, {len(series.manifest.files)} blob ids each"

    version = opts.wheelhouse.python_version if opts.wheelhouse else "of the wheelhouse"
    torch_pin = series.manifest.release.torch or "?"
    cuda = [] if opts.rehearse else ["&&", opts.python, "-c", CUDA_CHECK]
    policy = "any" if opts.any_torch else "pinned"
    return [
        Stage(
            "preflight",
            f"Python {version} and {'no GPU (rehearsal)' if opts.rehearse else 'a CUDA GPU'} "
            "are present",
            [opts.python, "--version", *([] if opts.rehearse else ["&&", "nvidia-smi", "-L"])],
            action=partial(preflight, opts.python, version, need_gpu=not opts.rehearse),
        ),
        Stage(
            "torch-check",
            f"the runner's own torch is the base's pin ({torch_pin}) with a torchvision",
            [opts.python, "-c", TORCH_CHECK, torch_pin, policy, *cuda],
            needs=("preflight",),
            judge=judge_with_warnings,
        ),
        Stage(
            "install",
            f"only from the wheelhouse, hash-checked, into {rel(opts.site)}",
            [
                *(opts.python, *PIP_INSTALL, "--no-index", "--no-deps", "--require-hashes"),
                "--no-compile",  # compiling every module was 2/3 of the stage; tests compile theirs
                *("--find-links", str(opts.wheelhouse_dir), "--upgrade", "--target"),
                *(str(opts.site), "-r", str(opts.requirements)),
            ],
            needs=("torch-check",),
        ),
        _facts(opts, opts.python, ("torch-check",)),
        Stage(
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
        ),
        *_gpu_stages(opts, opts.python),
    ]


def _facts(opts: Options, python: str, needs: tuple[str, ...]) -> Stage:
    return Stage(
        "facts",
        "the machine's facts into facts.json: nvidia-smi, clocks, torch, triton, git",
        [
            *("nvidia-smi", "&&", "nvidia-smi", f"--query-gpu={evidence.CLOCKS}", "--format=csv"),
            *("&&", python, "-c", "import torch, triton", "&&", "command", "-v", "git"),
        ],
        needs=needs,
        action=lambda: evidence.record(python, opts.reports),
    )


def facts(opts: Options) -> dict[str, str]:
    """What the dry run's plan shows above its stages."""
    manifest, house = opts.series.manifest, opts.wheelhouse
    shown = {
        "repository": str(ROOT),
        "base": f"sglang {manifest.base.version}, steps {', '.join(manifest.steps)}",
        "python": opts.python,
        "reports": str(opts.reports),
    }
    if opts.venv is not None:
        wheel = paths.cache_dir() / manifest.base.wheel
        return shown | {"venv": str(opts.venv), "wheel": str(wheel)}
    held = "MISSING: a real run refuses"
    if house:
        held = f"Python {house.python_version}, {len(house.entries)} wheels, "
        held += f"{house.total_bytes / 2**20:.1f} MiB, hashes checked"
    return shown | {
        "wheelhouse": f"{opts.wheelhouse_dir} ({held})",
        "site": str(opts.site),
        "step files": f"{opts.step_files} (blob ids checked against pin.toml)",
        "step trees": str(opts.trees),
    }
