"""The offline GPU runner's wheelhouse (what the CUDA image lacks of the import closure, the test
pins, the sglang wheel), and the image's double for a rehearsal: our test environment holds the
whole closure, so it would hide what is missing."""

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from patchset import wheel as wheels
from patchset.errors import BackportError, Exit
from patchset.lock import marked_folder
from patchset.manifest import PinManifest, sha256_of
from patchset.paths import PROJECT_ROOT, cache_dir
from testrun import venv

from .evidence import python_version as version_of

MANIFEST = "wheelhouse.json"
TEST_PINS = PROJECT_ROOT / "ci" / "requirements-gpu-test.txt"
LIMIT_BYTES = 60 * 1024 * 1024  # what may travel to the runner, with room to spare
DOUBLE_PINS = PROJECT_ROOT / "ci" / "requirements-image-double.txt"
DOUBLE_PYTHON = "3.12"  # the image's Python is 3.12.3

# A CUDA torch image's torch, what torch needs, torchvision (with pillow) built for that
# torch, numpy: torch and torchvision must match, so neither can come from the wheelhouse.
IMAGE_HOLDS = (
    "torch", "torchvision", "pillow", "triton", "numpy", "filelock", "fsspec", "jinja2",
    "markupsafe", "mpmath", "networkx", "sympy", "typing-extensions", "setuptools",
)  # fmt: skip
IMAGE_PREFIXES = ("nvidia-", "cuda-")
# Not imported by the modules under test (found by blocking each): left out for the limit.
NOT_IMPORTED = (
    "annotated-doc", "asttokens", "executing", "hf-xet", "ipython-pygments-lexers", "jedi",
    "jiter", "markdown-it-py", "matplotlib-inline", "mdurl", "parso", "pexpect",
    "prompt-toolkit", "ptyprocess", "pure-eval", "shellingham", "stack-data", "truststore",
    "typer", "wcwidth", "ruff",
)  # fmt: skip
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)==([^\s\\;]+)")  # name==version, hashes skipped
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
_setup = partial(BackportError, Exit.SETUP)  # a setup failure: its problem, its next step


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    return {m[1]: m[2] for line in path.read_text("utf-8").splitlines() if (m := PIN.match(line))}


def closure_file(manifest: PinManifest) -> Path:
    return venv.env_for(manifest).requirements[0]  # the CPU import closure, exactly pinned


def wanted_pins(manifest: PinManifest) -> dict[str, str]:
    """The packages the wheelhouse holds besides sglang, with their exact versions."""
    leave_out = {canonical(n) for n in (*IMAGE_HOLDS, *NOT_IMPORTED)}
    pins = {
        name: version
        for name, version in read_pins(closure_file(manifest)).items()
        if canonical(name) not in leave_out and not canonical(name).startswith(IMAGE_PREFIXES)
    } | read_pins(TEST_PINS)
    return dict(sorted(pins.items(), key=lambda kv: canonical(kv[0])))


@dataclass(frozen=True)
class Entry:
    name: str
    version: str
    file: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Wheelhouse:
    python_version: str
    sglang_wheel: str
    entries: list[Entry]
    total_bytes: int

    def requirements(self) -> str:
        """For pip --require-hashes: every wheel but sglang's, which is laid out as a tree."""
        return "".join(
            f"{e.name}=={e.version} --hash=sha256:{e.sha256}\n"
            for e in self.entries
            if e.file != self.sglang_wheel
        )


def _dist_of(file: str) -> tuple[str, str]:
    name, version = file.split("-")[:2]
    return canonical(name), version


def build(manifest: PinManifest, python_version: str, out: Path, cache: Path) -> Wheelhouse:
    """Download the wheels into out and write its manifest; the wheelhouse, checked."""
    if not re.fullmatch(r"3\.\d+", python_version):
        raise BackportError(
            Exit.USAGE, f"--python-version {python_version!r} is not like 3.12", "pass e.g. 3.12"
        )
    with contextlib.suppress(BackportError):  # load checks every pin and hash
        if (house := load(out, manifest)).python_version == python_version:
            print(f"{out} already holds every wheel, each with its sha256: nothing to download")
            return house
    out.mkdir(parents=True, exist_ok=True)
    with marked_folder(out, ".download-") as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--python-version", python_version,
            *(f"--platform={p}" for p in PLATFORMS), "--dest", str(tmp),
            *(f"{name}=={version}" for name, version in wanted_pins(manifest).items()),
        ]  # fmt: skip
        print(f"$ {' '.join(command)}", flush=True)
        if rc := subprocess.run(command).returncode:
            raise _setup(
                f"pip download failed with exit code {rc} (its output is above)",
                "run it where the package index is reachable; a pin with no wheel for "
                f"Python {python_version} on x86_64 Linux needs another base or Python",
            )
        for path in tmp.glob("*.whl"):
            path.replace(out / path.name)
    sglang = wheels.fetch_wheel(manifest.base, cache)
    shutil.copyfile(sglang, out / sglang.name)
    write_manifest(manifest, python_version, out)
    return load(out, manifest)  # the hashes read back


def write_manifest(manifest: PinManifest, python_version: str, out: Path) -> None:
    by_dist = {_dist_of(p.name): p for p in out.glob("*.whl")}
    wanted = [(canonical(name), version) for name, version in wanted_pins(manifest).items()]
    if lost := [f"{name}=={version}" for name, version in wanted if (name, version) not in by_dist]:
        raise _setup(
            f"pip did not bring {', '.join(lost)} into {out}", "run it again; report it if it stays"
        )
    entries = [
        Entry(*_dist_of(p.name), p.name, sha256_of(p), p.stat().st_size)
        for p in (out / manifest.base.wheel, *(by_dist[w] for w in wanted))
    ]
    data = {
        "base": manifest.base.version,
        "python_version": python_version,
        "sglang_wheel": manifest.base.wheel,
        "image_holds": [*IMAGE_HOLDS, *(p + "*" for p in IMAGE_PREFIXES)],
        "total_bytes": sum(e.size for e in entries),
        "packages": [e.__dict__ for e in entries],
    }
    (out / MANIFEST).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def load(folder: Path, manifest: PinManifest) -> Wheelhouse:
    """The wheelhouse in folder, checked against its manifest and the base; refuse otherwise."""
    again = f"build it again with `ci/run-gpu wheelhouse --out {folder}` where PyPI is reachable"
    refuse = partial(_setup, next_step=again)
    if not (path := folder / MANIFEST).is_file():
        raise refuse(f"{folder} holds no {MANIFEST}: not a wheelhouse")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        entries = [Entry(**e) for e in data["packages"]]
        base, python_version, sglang = data["base"], data["python_version"], data["sglang_wheel"]
    except (ValueError, KeyError, TypeError) as err:
        raise refuse(f"{path} is damaged: {err}") from None
    if base != manifest.base.version or sglang != manifest.base.wheel:
        raise refuse(
            f"the wheelhouse {folder} is for sglang {base}, not {manifest.base.version}",
            next_step=f"pass --base {base}, or {again}",
        )
    have = {_dist_of(e.file) for e in entries}
    for name, version in wanted_pins(manifest).items():
        if (canonical(name), version) not in have:
            raise refuse(f"the wheelhouse {folder} lacks the package {name}=={version}")
    for entry in entries:
        if not (wheel := folder / entry.file).is_file():
            raise refuse(
                f"the wheelhouse {folder} lacks {entry.file} (package {entry.name}), "
                "which its manifest lists"
            )
        if sha256_of(wheel) != entry.sha256:
            raise refuse(
                f"{entry.file} (package {entry.name}) in {folder} does not have the sha256 "
                f"its manifest lists ({entry.sha256}): damaged or replaced"
            )
    if not any(e.file == sglang and e.sha256 == manifest.base.sha256 for e in entries):
        raise refuse(
            f"the wheelhouse's {sglang} is not the wheel the patch set pins "
            f"({manifest.base.sha256})"
        )
    return Wheelhouse(python_version, sglang, entries, sum(e.size for e in entries))


def ensure_double() -> Path:
    """The image double's python, made (or synced to its pins) first with python3.12 on PATH
    if it runs (a shim may not), else pyenv's newest: none is downloaded."""
    digest = hashlib.sha256(f"python {DOUBLE_PYTHON}\n".encode() + DOUBLE_PINS.read_bytes())
    folder = cache_dir() / "venvs" / f"gpu-image-double-{digest.hexdigest()[:16]}"
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    pyenv = sorted(
        root.glob(f"{DOUBLE_PYTHON}.*/bin/python{DOUBLE_PYTHON}"),
        key=lambda p: [int(x) for x in p.parts[-3].split(".") if x.isdigit()],
        reverse=True,
    )
    on_path = shutil.which(f"python{DOUBLE_PYTHON}")
    runs = (p for p in [on_path, *map(str, pyenv)] if p and version_of(p) == DOUBLE_PYTHON)
    if (python := next(runs, None)) is None:
        raise BackportError(
            Exit.ENVIRONMENT,
            f"no Python {DOUBLE_PYTHON} runs here (python{DOUBLE_PYTHON} on PATH: "
            f"{on_path or 'none'}; {root}: {len(pyenv)} {DOUBLE_PYTHON}.x): the image double "
            "needs the image's Python",
            f"install Python {DOUBLE_PYTHON} (e.g. `pyenv install {DOUBLE_PYTHON}`) and run again",
        )
    venv.ensure_venv(folder, [DOUBLE_PINS], "the lent machine's image, doubled", python=python)
    return venv.venv_python(folder)
