"""The offline GPU mode: its wheelhouse, its checks and its plan, on a machine without a GPU."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_GPU = ROOT / "ci" / "run-gpu"
sys.path.insert(0, str(ROOT / "ci"))

from gpustage import layout, plan, stages, wheelhouse  # noqa: E402
from patchset import paths  # noqa: E402
from patchset.errors import BackportError, Exit  # noqa: E402
from patchset.manifest import Series, sha256_of  # noqa: E402


def run_gpu(*args: str, build: Path, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUN_GPU), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "SGLANG_BACKPORTS_BUILD": str(build)},
    )


@pytest.fixture
def fake_wheelhouse(tmp_path: Path, series: Series, wheel_cache: Path) -> Path:
    """A wheelhouse with the real sglang wheel and stand-in files for the other wheels.

    Only the checks read it (names, versions, sha256), so the files need not be wheels.
    """
    house = tmp_path / "wheelhouse"
    house.mkdir()
    shutil.copyfile(wheel_cache / series.manifest.base.wheel, house / series.manifest.base.wheel)
    for name, version in wheelhouse.wanted_pins(series.manifest).items():
        file = f"{wheelhouse.canonical(name).replace('-', '_')}-{version}-py3-none-any.whl"
        (house / file).write_text(f"{name} {version}\n")
    wheelhouse.write_manifest(series.manifest, "3.12", house)
    return house


def test_the_wheelhouse_holds_the_closure_less_the_image(series: Series) -> None:
    pins = {wheelhouse.canonical(n): v for n, v in wheelhouse.wanted_pins(series.manifest).items()}
    for name, version in {
        "transformers": "5.12.1", "orjson": "3.13.0", "pybase64": "1.5.1", "msgspec": "0.23.0",
        "partial-json-parser": "0.2.1.1.post7", "xgrammar": "0.2.9", "pytest": "9.0.1",
    }.items():  # fmt: skip
        assert pins.get(name) == version, name
    for name in ("torch", "torchvision", "triton", "numpy", "jedi", "nvidia-nccl-cu13"):
        assert name not in pins, name
    # Every pin of the CPU closure is accounted for: in the wheelhouse, the image, or unused.
    known = {wheelhouse.canonical(n) for n in (*wheelhouse.IMAGE_HOLDS, *wheelhouse.NOT_IMPORTED)}
    for name in wheelhouse.read_pins(wheelhouse.closure_file(series.manifest)):
        c = wheelhouse.canonical(name)
        assert c in pins or c in known or c.startswith(wheelhouse.IMAGE_PREFIXES), name


def test_a_complete_wheelhouse_is_accepted(fake_wheelhouse: Path, series: Series) -> None:
    house = wheelhouse.load(fake_wheelhouse, series.manifest)
    assert house.python_version == "3.12"
    lines = house.requirements().splitlines()
    assert len(lines) == len(wheelhouse.wanted_pins(series.manifest))
    assert any(line.startswith("transformers==5.12.1 --hash=sha256:") for line in lines)
    assert not any(line.startswith("sglang") for line in lines)  # laid out, not installed
    data = json.loads((fake_wheelhouse / wheelhouse.MANIFEST).read_text())
    sglang = next(p for p in data["packages"] if p["name"] == "sglang")
    assert sglang["sha256"] == series.manifest.base.sha256


def test_offline_dry_run_prints_the_plan(
    fake_wheelhouse: Path, tmp_path: Path, series: Series
) -> None:
    build = tmp_path / "build"
    result = run_gpu("--offline", "--wheelhouse", str(fake_wheelhouse), "--dry-run", build=build)
    assert result.returncode == 0, result.stderr
    plan = result.stdout
    final = series.manifest.final_step
    names = ["preflight", "torch-check", "install", "facts", "layout"]
    names += [f"gpu-{s}" for s in series.manifest.steps]
    names += [f"gpu-{final}-long", "control-sleep-0", "control-1", "bench"]
    positions = [plan.find(f". {n}: ") for n in names]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), positions
    assert "hashes checked" in plan
    site = build / "gpu-site"
    assert (
        f"-m pip install --disable-pip-version-check --no-index --no-deps --require-hashes "
        f"--no-compile --find-links {fake_wheelhouse} --upgrade --target {site} -r "
    ) in plan
    assert f"the base pins torch {series.manifest.release.torch}" not in plan  # said at run time
    assert f"{series.manifest.release.torch} pinned" in plan
    assert f"step files  {build / 'gpu-step-files'} (blob ids checked against pin.toml)" in plan
    assert "git " not in plan.replace("command -v git", "")  # the offline layout needs no git
    tree = build / "gpu-trees" / series.manifest.base.version / final / "python"
    assert f"PYTHONPATH={tree}:{site}:{ROOT / 'scripts'} " in plan
    assert "scripts/run-tests" not in plan  # the CPU gate runs where the network is
    assert not build.exists()


def test_offline_dry_run_without_a_wheelhouse_says_so(tmp_path: Path) -> None:
    result = run_gpu(
        "--offline", "--wheelhouse", str(tmp_path / "none"), "--dry-run", build=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "(MISSING: a real run refuses)" in result.stdout


def test_offline_run_without_a_wheelhouse_refuses(tmp_path: Path) -> None:
    result = run_gpu("--offline", "--wheelhouse", str(tmp_path / "none"), build=tmp_path)
    assert result.returncode == Exit.SETUP, result.stderr
    assert "holds no wheelhouse.json: not a wheelhouse" in result.stderr
    assert "ci/run-gpu wheelhouse" in result.stderr


def _orjson(house: Path) -> Path:
    return next(house.glob("orjson-*.whl"))


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_a_wheelhouse_missing_a_wheel_is_refused(
    fake_wheelhouse: Path, tmp_path: Path, dry_run: bool
) -> None:
    _orjson(fake_wheelhouse).unlink()
    args = ["--offline", "--wheelhouse", str(fake_wheelhouse)] + (["--dry-run"] if dry_run else [])
    result = run_gpu(*args, build=tmp_path / "build")
    assert result.returncode == Exit.SETUP, result.stderr
    assert "lacks orjson-3.13.0-py3-none-any.whl (package orjson)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "build").exists()


def test_a_wheelhouse_whose_manifest_lacks_a_package_is_refused(
    fake_wheelhouse: Path, tmp_path: Path, series: Series
) -> None:
    path = fake_wheelhouse / wheelhouse.MANIFEST
    data = json.loads(path.read_text())
    data["packages"] = [p for p in data["packages"] if p["name"] != "msgspec"]
    path.write_text(json.dumps(data))
    result = run_gpu("--offline", "--wheelhouse", str(fake_wheelhouse), "--dry-run", build=tmp_path)
    assert result.returncode == Exit.SETUP, result.stderr
    assert "lacks the package msgspec==0.23.0" in result.stderr


def test_a_wheel_with_a_wrong_hash_is_refused(fake_wheelhouse: Path, tmp_path: Path) -> None:
    _orjson(fake_wheelhouse).write_text("something else\n")
    result = run_gpu("--offline", "--wheelhouse", str(fake_wheelhouse), "--dry-run", build=tmp_path)
    assert result.returncode == Exit.SETUP, result.stderr
    assert "(package orjson)" in result.stderr
    assert "does not have the sha256 its manifest lists" in result.stderr


def test_a_wheelhouse_for_another_base_is_refused(fake_wheelhouse: Path, series: Series) -> None:
    path = fake_wheelhouse / wheelhouse.MANIFEST
    data = json.loads(path.read_text())
    data["base"] = "0.5.13"
    path.write_text(json.dumps(data))
    with pytest.raises(wheelhouse.BackportError, match=r"is for sglang 0\.5\.13") as err:
        wheelhouse.load(fake_wheelhouse, series.manifest)
    assert err.value.code == Exit.SETUP


def _index_reachable(dest: Path) -> bool:
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
         "--dest", str(dest), "pluggy==1.7.0"],
        capture_output=True, timeout=120,
    )  # fmt: skip
    return probe.returncode == 0


def _make_wheelhouse(out: Path) -> subprocess.CompletedProcess[str]:
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return subprocess.run(
        [
            sys.executable,
            str(RUN_GPU),
            "wheelhouse",
            "--python-version",
            version,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )


@pytest.fixture(scope="session")
def real_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real wheelhouse for this Python, kept in the cache folder across sessions.

    The first session downloads it (skipped where the package index is not
    reachable); later ones find it current and download nothing.
    """
    out = paths.cache_dir() / "test-wheelhouse" / f"py{sys.version_info[0]}.{sys.version_info[1]}"
    result = _make_wheelhouse(out)
    if result.returncode != 0 and not _index_reachable(tmp_path_factory.mktemp("probe")):
        pytest.skip("the package index is not reachable: the wheelhouse is built where it is")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_a_current_wheelhouse_is_kept_as_it_is(real_wheelhouse: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in real_wheelhouse.iterdir()}
    again = _make_wheelhouse(real_wheelhouse)
    assert again.returncode == 0, again.stderr
    assert "nothing to download" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in real_wheelhouse.iterdir()} == before


def test_a_real_wheelhouse_verifies_and_fits(real_wheelhouse: Path, series: Series) -> None:
    house = wheelhouse.load(real_wheelhouse, series.manifest)
    on_disk = sum(p.stat().st_size for p in real_wheelhouse.glob("*.whl"))
    assert house.total_bytes == on_disk
    assert on_disk < wheelhouse.LIMIT_BYTES, f"{on_disk / 2**20:.1f} MiB"
    for entry in house.entries:
        assert sha256_of(real_wheelhouse / entry.file) == entry.sha256


@pytest.mark.parametrize("policy", ["pinned", "any"])
def test_the_runner_torch_is_checked_against_the_pin(
    tmp_path: Path, series: Series, policy: str
) -> None:
    """This venv's torch is not the base's pin: refused, or run with a warning (--any-torch).

    Its version is read from its metadata: the check imports torch in its own process, and
    an import here (seconds) would only tell whether to skip."""
    for name in ("torch", "torchvision"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"could not import {name!r}")
    pin = series.manifest.release.torch
    have = importlib.metadata.version("torch").split("+")[0]
    if have == pin:
        pytest.skip(f"this torch is the base's pin {pin}")
    stage = stages.Stage(
        "torch-check", "p", [sys.executable, "-c", plan.TORCH_CHECK, pin, policy],
        judge=stages.judge_with_warnings,
    )  # fmt: skip
    outcome = stages.run_stage(stage, {}, tmp_path)
    said = f"the base pins torch {pin}, the runner has {have}"
    if policy == "pinned":
        assert not outcome.ok
        assert outcome.result == f"FAIL: exit 3; FAIL: {said}"
    else:
        assert outcome.ok
        assert outcome.result == f"ok; WARNING: {said}"


def test_a_run_removes_an_earlier_runs_records_and_nothing_else(
    fake_wheelhouse: Path, tmp_path: Path, series: Series
) -> None:
    """An earlier run's bench.json must not be read as this run's figure, nor packed.

    The run stops at its preflight (no such Python), so nothing is installed."""
    build = tmp_path / "build"
    step_files = tmp_path / "step-files"
    layout.write_step_files(series, fake_wheelhouse / series.manifest.base.wheel, step_files)
    reports = tmp_path / "reports"
    reports.mkdir()
    for name in ("bench.json", "gpu-base.json", "facts.json", "notes.txt"):
        (reports / name).write_text("{}")
    result = run_gpu(
        "--offline", "--wheelhouse", str(fake_wheelhouse), "--step-files", str(step_files),
        "--python", str(tmp_path / "no-python"), "--reports", str(reports),
        "--tarball", str(tmp_path / "gpu.tar.gz"), build=build,
    )  # fmt: skip
    assert result.returncode == Exit.SETUP, result.stderr
    left = sorted(p.name for p in reports.iterdir())
    assert left == ["criteria.md", "notes.txt", "summary.md"], left
    summary = (reports / "summary.md").read_text()
    assert "| preflight " in summary and "not run: preflight failed" in summary
    assert "| benchmark " in summary and "not run (no record: see the stage table)" in summary
    with tarfile.open(tmp_path / "gpu.tar.gz") as archive:
        assert "reports/summary.md" in archive.getnames()


def _run_gpu_module() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("run_gpu_script", str(RUN_GPU))
    spec = importlib.util.spec_from_loader("run_gpu_script", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_tarball_and_the_log_survive_an_internal_error(
    fake_wheelhouse: Path, tmp_path: Path, series: Series, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug of ours in the middle of a lent machine's run: the reports are still packed,
    and the log written as the run went holds what it printed and the trace."""
    run_gpu_script = _run_gpu_module()
    step_files = tmp_path / "step-files"
    layout.write_step_files(series, fake_wheelhouse / series.manifest.base.wheel, step_files)

    def broken(*args: object, **kwargs: object) -> None:
        print("a stage ran")
        raise RuntimeError("a bug in the middle of the run")

    monkeypatch.setattr(run_gpu_script.stages, "run_all", broken)
    monkeypatch.setenv("SGLANG_BACKPORTS_BUILD", str(tmp_path / "build"))
    tarball, log = tmp_path / "out" / "gpu.tar.gz", tmp_path / "out" / "gpu-run.log"
    monkeypatch.setattr(sys, "argv", [
        str(RUN_GPU), "--offline", "--wheelhouse", str(fake_wheelhouse), "--step-files",
        str(step_files), "--reports", str(tmp_path / "reports"), "--tarball", str(tarball),
        "--log", str(log),
    ])  # fmt: skip
    with pytest.raises(RuntimeError, match="a bug in the middle"):
        run_gpu_script.main()
    with tarfile.open(tarball) as archive:
        assert "reports/criteria.md" in archive.getnames()
    text = log.read_text(encoding="utf-8")
    assert "a stage ran\n" in text and "RuntimeError: a bug in the middle of the run" in text
    assert f"reports packed into {tarball}" in text


def test_a_pin_pip_did_not_bring_is_named_before_a_manifest_is_written(
    fake_wheelhouse: Path, series: Series
) -> None:
    (fake_wheelhouse / wheelhouse.MANIFEST).unlink()
    next(fake_wheelhouse.glob("msgspec-*.whl")).unlink()
    with pytest.raises(BackportError) as refused:
        wheelhouse.write_manifest(series.manifest, "3.12", fake_wheelhouse)
    assert "pip did not bring msgspec==0.23.0" in refused.value.problem
    assert not (fake_wheelhouse / wheelhouse.MANIFEST).exists()
