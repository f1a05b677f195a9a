"""The README's recipe for the official image, run on a double of the image's layout.

lmsysorg/sglang:v<release> (sglang's docker/Dockerfile) has python3 = Python
3.12 and installs sglang editable (`pip install -e "python[all]"`) from `git
clone --depth=1 --branch v<release>` at /sgl-workspace/sglang, its WORKDIR. The
double: a Python 3.12 venv; a shallow clone of the tag from a repository made of
the release's build tree; an editable install of it made by pip. The recipe's
COPY and RUN lines then run as the README writes them, with the image's paths
laid out under a scratch folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import SCRIPTS, SESSION_TREES, commit_all, git, make_venv, pip
from patched_wheel import interpreter
from patchset import buildtree, paths
from patchset.errors import Exit
from patchset.manifest import Series

pytestmark = SESSION_TREES

ROOT = SCRIPTS.parent
# The image's folders the recipe names; the double lays them out under its own root.
IMAGE_PATH = re.compile(r"(?<![\w.-])/(sgl-workspace|opt)/")
# sglang's repository has python/pyproject.toml (setuptools); a tree laid out
# from the wheel has none, so the double's release commit adds one.
PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "{version}"

[tool.setuptools.packages.find]
include = ["sglang*"]
"""


def recipe_block(document: Path) -> str:
    """The one ```dockerfile block of document that starts FROM lmsysorg/sglang."""
    text = document.read_text(encoding="utf-8")
    blocks = [
        block
        for block in re.findall(r"^```dockerfile\n(.*?)^```$", text, re.M | re.S)
        if block.startswith("FROM lmsysorg/sglang:")
    ]
    assert len(blocks) == 1, f"{document}: {len(blocks)} recipes for the official image"
    return blocks[0]


@dataclass(frozen=True)
class Recipe:
    release: str
    copies: list[tuple[str, str]]  # (source in this project, destination in the image)
    runs: list[str]  # each RUN's command, its continuation lines joined as Docker does


def parse(block: str) -> Recipe:
    release, copies, runs = "", [], []
    for line in block.replace("\\\n", "").splitlines():
        instruction, _, rest = line.partition(" ")
        if instruction == "FROM":
            found = re.fullmatch(r"lmsysorg/sglang:v(\S+)", rest)
            assert found, line
            release = found[1]
        elif instruction == "COPY":
            source, dest = rest.split()
            copies.append((source, dest))
        elif instruction == "RUN":
            runs.append(rest)
        else:
            pytest.fail(f"the recipe's {instruction} has no meaning in the image's double")
    return Recipe(release, copies, runs)


@pytest.fixture(scope="module")
def recipe(series: Series) -> Recipe:
    parsed = parse(recipe_block(ROOT / "README.md"))
    assert parsed.release == series.manifest.base.version, "the recipe names the default release"
    return parsed


@pytest.fixture(scope="module")
def release_repo(
    tmp_path_factory: pytest.TempPathFactory, series: Series, session_step_trees: dict[str, Path]
) -> Path:
    """sglang's repository as far as the image sees it: the release's tree, tagged v<release>."""
    manifest = series.manifest
    tree = buildtree.build_tree_path(series, paths.build_dir())
    repo = tmp_path_factory.mktemp("upstream") / "sglang"
    pristine = buildtree.pristine_tag(manifest)
    subprocess.run(["git", "clone", "-q", "--branch", pristine, str(tree), str(repo)], check=True)
    (repo / "python" / "pyproject.toml").write_text(PYPROJECT.format(version=manifest.base.version))
    commit_all(repo, f"sglang {manifest.base.version}")
    git(repo, "tag", manifest.release.tag)
    # The image's shallow clone packs the whole tree from here; without a delta search or
    # deflate (what is checked out is the same) git's user CPU there drops from 4.4 s to 1 s.
    git(repo, "config", "pack.window", "0")
    git(repo, "config", "pack.compression", "0")
    return repo


@dataclass(frozen=True)
class Image:
    root: Path  # where the image's / is laid out
    python: Path  # its python3, in a venv of Python 3.12
    checkout: Path  # /sgl-workspace/sglang

    def env(self) -> dict[str, str]:
        """What a RUN line gets: the image's python3 first on PATH, a HOME of its own."""
        home = self.root / "root"
        home.mkdir(exist_ok=True)
        return {
            "PATH": f"{self.python.parent}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(home),
            "LANG": "C.UTF-8",
        }

    def in_image(self, command: str) -> str:
        """A recipe's command with the image's paths laid out under root."""
        return IMAGE_PATH.sub(rf"{self.root}/\1/", command)

    def run(self, command: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/bin/sh", "-c", command],
            cwd=cwd or self.checkout,
            env=self.env(),
            capture_output=True,
            text=True,
        )


def pip_312_env(**more: str) -> dict[str, str]:
    """The environment of pip acting on the image's Python 3.12: its bytecode kept.

    pip and setuptools run as source under 3.12 (this venv holds their 3.11 bytecode), and
    this machine sets PYTHONDONTWRITEBYTECODE: each pip run compiled them again (about 3
    CPU-s). Their 3.12 bytecode goes to a folder of the cache instead, read by later runs.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(paths.cache_dir() / "test-pycache"), **more}


def image_double(root: Path, release_repo: Path, series: Series, clone: bool = True) -> Image:
    """The official image's layout of sglang, made as its Dockerfile makes it; without
    clone, release_repo itself is the editable checkout (a test that only reads it)."""
    checkout = root / "sgl-workspace" / "sglang" if clone else release_repo
    if clone:
        subprocess.run(
            ["git", "clone", "-q", "--depth=1", "--branch", series.manifest.release.tag,
             release_repo.as_uri(), str(checkout)],
            check=True, capture_output=True,
        )  # fmt: skip
    python = make_venv(root / "usr", interpreter("3.12"))
    # pip install -e python, with this environment's setuptools as the build backend
    # (offline); the venv gets what pip records for an editable install.
    editable = ["install", "--no-deps", "--no-index", "--no-build-isolation", "--quiet", "-e"]
    pip(
        python,
        *editable,
        str(checkout / "python"),
        env=pip_312_env(PYTHONPATH=sysconfig.get_paths()["purelib"]),
    )
    return Image(root, python, checkout)


def site_packages(image: Image) -> Path:
    return next((image.python.parent.parent / "lib").glob("python3.12/site-packages"))


def check_install(image: Image, *args: str, cwd: Path | None = None):
    """The project's check-install, run by the image's python3."""
    result = image.run(f"python3 {SCRIPTS / 'check-install'} {' '.join(args)}", cwd)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_the_readme_recipe_patches_the_image_layout(
    tmp_path: Path, recipe: Recipe, release_repo: Path, series: Series, patched_tree: Path
):
    image = image_double(tmp_path / "image", release_repo, series)
    base = series.manifest.base.version
    # the double is the image's layout: a shallow checkout of the tag, editable
    assert (image.checkout / ".git" / "shallow").is_file()
    info = site_packages(image) / f"sglang-{base}.dist-info"
    assert json.loads((info / "direct_url.json").read_text())["dir_info"] == {"editable": True}
    (finder,) = site_packages(image).glob("__editable___sglang_*_finder.py")
    assert repr(str(image.checkout / "python" / "sglang")) in finder.read_text()
    before = check_install(image)
    assert before.returncode == Exit.AFFECTED, before.stdout + before.stderr
    assert "(Python 3.12." in before.stdout.splitlines()[0]

    for source, dest in recipe.copies:
        assert (ROOT / source).is_dir(), f"COPY {source} {dest}: no folder {source} in the project"
        target = image.root / dest.lstrip("/")
        shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
    for command in recipe.runs:
        result = image.run(image.in_image(command))
        assert result.returncode == 0, f"RUN {command}\n{result.stdout}{result.stderr}"

    after = check_install(image)
    assert after.returncode == Exit.OK, after.stdout + after.stderr
    assert re.search(
        rf"^verdict: patched: sglang {re.escape(base)} with the series ", after.stdout, re.M
    )
    assert after.stdout.count("editable: not in RECORD") == 3, after.stdout
    assert f"an editable install of {(image.checkout / 'python').as_uri()}" in after.stdout
    branch = git(image.checkout, "symbolic-ref", "HEAD")
    assert branch == f"refs/heads/sglang-backports/{base}"
    assert git(image.checkout, "status", "--porcelain") == ""
    # What race-check would read there (python/sglang, the work tree clean) is the session's
    # patched tree, file for file; test_racecheck_command's one run measures it race-free
    # (test_every_step_gives_the_expected_table), instead of a race-check run of its own.
    image_sglang = git(image.checkout, "rev-parse", "HEAD:python/sglang")
    assert image_sglang == git(patched_tree, "rev-parse", "HEAD:python/sglang")


def test_the_docs_give_the_readme_s_recipe():
    assert recipe_block(ROOT / "docs" / "check-install.md") == recipe_block(ROOT / "README.md")


def test_a_wheel_over_the_editable_install_leaves_the_checkout_unpatched(
    tmp_path: Path, release_repo: Path, series: Series
):
    """Why the recipe patches the checkout: the cp312 wheel installed over the editable
    install replaces it in site-packages, but the checkout's unpatched copy stays, and a
    process started in its python/ folder imports that one. The checkout is the release's
    repository itself (this test only reads it), not a shallow clone of its own."""
    image = image_double(tmp_path / "image", release_repo, series, clone=False)
    env = dict(os.environ, SGLANG_BACKPORTS_CACHE=str(paths.cache_dir()))
    build = subprocess.run(
        [sys.executable, str(SCRIPTS / "build-wheel"), "--python-version", "3.12",
         "--out", str(tmp_path / "dist")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("*-cp312-cp312-*.whl")
    pip(
        image.python,
        "install",
        "--no-deps",
        "--force-reinstall",
        "--no-index",
        "--no-compile",  # what is checked is where sglang is found, not its bytecode
        "--quiet",
        str(wheel),
        env=pip_312_env(),
    )
    assert list(site_packages(image).glob("__editable__*")) == []

    in_python = image.checkout / "python"
    assert check_install(image, cwd=in_python).returncode == Exit.OK
    imported = image.run(
        "python3 -c 'import importlib.util as u; print(u.find_spec(\"sglang\").origin)'",
        cwd=in_python,
    )
    assert imported.stdout.strip() == str(in_python / "sglang" / "__init__.py"), imported.stderr
    assert check_install(image, "--tree", str(image.checkout)).returncode == Exit.AFFECTED
