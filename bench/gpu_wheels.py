"""The wheels pagedq needs on the lent GPU machines, which have no network and lack its service stack.

    python bench/gpu_wheels.py [--dest .gpu-wheels]     (``make gpu-wheels``; here, where pip works)

Those machines start from a fixed image (Python 3.12, torch 2.11 + CUDA 13, triton 3.6, transformers
5.17, ...) without FastAPI, pydantic, Celery, the Redis client, SQLAlchemy, Alembic, psycopg, llguidance
or gguf, and download nothing. This downloads, for CPython 3.12 on manylinux x86_64, every runtime
dependency of pyproject.toml that the image lacks, with what those need, at the versions installed here
(the ones the tests ran), into an ignored folder that travels with the tree (at most 64 MiB in all).
``python -m bench.gpu_check`` installs them there with ``pip install --no-index --find-links`` before its
first step; pip leaves the image's own packages (torch, triton, numpy, ...) alone when they satisfy.

Standard library only (and ``packaging`` where present): the GPU machine imports this before the wheels
are installed.
"""

import argparse
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".gpu-wheels"
# pyproject's runtime dependencies that the GPU image already has (device README, KINDS.md).
ON_IMAGE = {
    "torch",
    "triton",
    "transformers",
    "tokenizers",
    "safetensors",
    "accelerate",
    "jinja2",
    "ninja",
    "numpy",
    "tqdm",
    "httpx",
    "prometheus-client",
}
# Large wheels that the dependencies above pull in and that the image holds in versions that satisfy them.
LEFT_ON_IMAGE = {"numpy", "uvloop"}
NEVER = re.compile(r"^(torch|triton|nvidia-.*)$")  # the image's CUDA stack is never replaced
MAX_MIB = 40  # the tree itself is a few MiB; the device takes 64 MiB in all
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return canonical(re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0])


def requirements() -> list[str]:
    """pyproject.toml's runtime requirements that the GPU image does not provide."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [r for r in project["dependencies"] if requirement_name(r) not in ON_IMAGE]


def unsatisfied(wanted: list[str]) -> list[str]:
    """The requirements this interpreter's installed packages do not meet (extras are not checked)."""
    missing = []
    for requirement in wanted:
        try:
            version = importlib.metadata.version(requirement_name(requirement))
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement)
            continue
        if not satisfies(requirement, version):
            missing.append(requirement)
    return missing


def satisfies(requirement: str, version: str) -> bool:
    try:
        from packaging.requirements import Requirement
    except ImportError:  # no packaging: an installed package of that name will do
        return True
    return Requirement(requirement).specifier.contains(version, prereleases=True)


def install(folder: Path, wanted: list[str]) -> subprocess.CompletedProcess[str]:
    """``wanted`` and what they need, from ``folder`` only, into this interpreter's environment."""
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(folder)]
    command += ["--disable-pip-version-check", "--no-input", *wanted]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def download(dest: Path) -> list[Path]:
    """Fresh wheels of ``requirements()`` and their dependencies, pinned to this environment's versions."""
    installed = {canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    pins = [f"{name}=={version}" for name, version in sorted(installed.items())]
    pins = [pin for pin in pins if not NEVER.match(pin.split("==")[0]) and "+" not in pin]
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write("\n".join(p for p in pins if p.split("==")[0] != "pagedq") + "\n")
        constraints.flush()
        command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(dest)]
        command += ["--python-version", "3.12", "--implementation", "cp", "--constraint", constraints.name]
        command += [flag for platform in PLATFORMS for flag in ("--platform", platform)]
        subprocess.run([*command, *requirements()], check=True)
    for wheel in dest.glob("*.whl"):
        if wheel_project(wheel) in LEFT_ON_IMAGE:
            wheel.unlink()
    return sorted(dest.glob("*.whl"))


def wheel_project(wheel: Path) -> str:
    return canonical(wheel.name.split("-", 1)[0])


def check(wheels: list[Path]) -> int:
    """Total bytes; raises when the folder holds the CUDA stack, two versions of a project, or too much."""
    projects = [wheel_project(w) for w in wheels]
    if forbidden := [p for p in projects if NEVER.match(p)]:
        raise SystemExit(f"{forbidden} would replace the image's CUDA stack: add what pulls them to ON_IMAGE")
    if twice := sorted({p for p in projects if projects.count(p) > 1}):
        raise SystemExit(f"two versions of {twice}: pip would refuse the folder")
    total = sum(w.stat().st_size for w in wheels)
    if total > MAX_MIB << 20:
        raise SystemExit(
            f"{total / 2**20:.1f} MiB of wheels: over {MAX_MIB} MiB, they cannot travel with the tree"
        )
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dest", type=Path, default=WHEELS)
    args = parser.parse_args()
    wheels = download(args.dest)
    total = check(wheels)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {args.dest} (limit {MAX_MIB} MiB)")


if __name__ == "__main__":
    main()
