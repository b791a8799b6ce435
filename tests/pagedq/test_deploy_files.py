"""docker-compose.yml, the Dockerfile, .env.example and .dockerignore against the code they deploy.

No container runtime runs in CI, so the image's own install steps (the Dockerfile's RUN lines, parsed, with
the CPU image's build args) run here in a throwaway venv that sees this environment's packages, so nothing
is downloaded; and the compose healthchecks run against the real PostgreSQL and Redis.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

import pytest
import torch
import yaml
from sqlalchemy.exc import OperationalError

from core.settings import Settings
from pagedq.cli import build_parser
from tests.support.services import free_port, redis_url, service_env
from worker.health import WorkerHealth

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
PAGEDQ_SERVICES = {name: s for name, s in SERVICES.items() if "build" in s}
LONG_RUNNING = {"api", "webhooks", "worker", "worker-cpu"}


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, rest), comments dropped and continued lines joined."""
    lines = [
        line for line in (REPO / "Dockerfile").read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (word.upper(), rest.strip())
        for word, rest in (line.split(None, 1) for line in joined.split("\n") if line.strip())
    ]


def instructions(keyword: str) -> list[str]:
    return [rest for word, rest in dockerfile() if word == keyword]


def dockerfile_args() -> dict[str, str]:
    return dict(arg.partition("=")[::2] for arg in instructions("ARG"))


def dockerfile_env() -> dict[str, str]:
    return dict(pair.split("=", 1) for env in instructions("ENV") for pair in shlex.split(env))


def compose_default(value: str) -> str:
    """A compose value with each ``${NAME:-default}`` at its default, as with an empty .env."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def build_args(service: str) -> dict[str, str]:
    args = SERVICES[service]["build"].get("args", {})
    return dockerfile_args() | {name: compose_default(value) for name, value in args.items()}


def active(service: dict, profile: str) -> bool:
    return not service.get("profiles") or profile in service["profiles"]


def setting_names() -> set[str]:
    return {f"PAGEDQ_{name.upper()}" for name in Settings.model_fields}


def env_example_names() -> set[str]:
    return set(re.findall(r"^#?\s*([A-Z_]+)=", (REPO / ".env.example").read_text(), flags=re.M))


def test_every_pagedq_service_runs_an_existing_command() -> None:
    parser = build_parser()
    assert set(PAGEDQ_SERVICES) == {"migrate", "api", "worker", "worker-cpu", "webhooks"}
    for name, service in PAGEDQ_SERVICES.items():
        args = parser.parse_args(service["command"])
        assert args.func is not None, name


def test_every_variable_the_files_set_is_a_setting() -> None:
    names = set()
    for service in PAGEDQ_SERVICES.values():
        names |= {k for k in service["environment"] if k.startswith("PAGEDQ_")}
    names |= {name for name in env_example_names() if name.startswith("PAGEDQ_")}
    names |= {name for name in dockerfile_env() if name.startswith("PAGEDQ_")}
    assert names and names <= setting_names() | {"PAGEDQ_CACHE_DIR"}, names - setting_names()


def test_env_example_sets_only_what_compose_reads() -> None:
    compose_text = (REPO / "docker-compose.yml").read_text()
    others = {name for name in env_example_names() if not name.startswith("PAGEDQ_")}
    assert others - {"COMPOSE_PROFILES"} <= set(re.findall(r"\$\{(\w+)", compose_text))
    profiles = re.search(r"^COMPOSE_PROFILES=(\S+)", (REPO / ".env.example").read_text(), flags=re.M)
    known = {p for service in SERVICES.values() for p in service.get("profiles", [])}
    assert profiles and set(profiles[1].split(",")) <= known


def test_the_services_wait_for_what_they_need() -> None:
    assert "healthcheck" in SERVICES["postgres"] and "healthcheck" in SERVICES["redis"]
    assert SERVICES["postgres"]["volumes"] and SERVICES["migrate"]["restart"] == "no"
    for name in LONG_RUNNING:
        needs = SERVICES[name]["depends_on"]
        assert needs["migrate"]["condition"] == "service_completed_successfully", name
        assert needs["redis"]["condition"] == "service_healthy", name
        assert SERVICES[name]["healthcheck"]["test"][0] == "CMD", name
    gpu = SERVICES["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert SERVICES["worker-cpu"]["environment"]["PAGEDQ_DEVICE"] == "cpu"


def test_the_database_and_broker_urls_point_at_the_compose_services() -> None:
    env = PAGEDQ_SERVICES["api"]["environment"]
    postgres = SERVICES["postgres"]["environment"]
    user, password, db = postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], postgres["POSTGRES_DB"]
    assert env["PAGEDQ_DATABASE_URL"] == f"postgresql+psycopg://{user}:{password}@postgres:5432/{db}"
    assert env["PAGEDQ_BROKER_URL"].startswith("redis://redis:6379/")


def test_state_that_must_outlive_a_container_is_on_named_volumes() -> None:
    env = dockerfile_env()
    volumes = set(COMPOSE["volumes"])
    mounts = {
        name: dict(reversed(compose_default(v).split(":")[:2]) for v in s.get("volumes", []))
        for name, s in SERVICES.items()
    }
    assert mounts["webhooks"][env["PAGEDQ_DATA_DIR"]] in volumes  # the generated webhook secret
    assert mounts["worker"][env["TRITON_CACHE_DIR"]] in volumes  # compiled kernels


def test_each_profile_builds_only_its_torch_variant() -> None:
    """``--profile cpu`` builds no CUDA image, and one image tag always means one set of build args."""
    declared = dockerfile_args()
    by_image: dict[str, dict[str, str]] = {}
    for name, service in PAGEDQ_SERVICES.items():
        assert set(service["build"].get("args", {})) <= set(declared), name
        assert by_image.setdefault(service["image"], build_args(name)) == build_args(name), name
    for name, service in PAGEDQ_SERVICES.items():
        on_cpu = build_args(name)["TORCH_INDEX_URL"].endswith("/whl/cpu")
        assert on_cpu == active(service, "cpu") == (name != "worker"), name
    assert not active(SERVICES["worker"], "cpu") and active(SERVICES["worker"], "gpu")


def test_the_image_pins_the_torch_the_tests_run() -> None:
    makefile = re.search(r"pip install .*torch==(\S+)", (REPO / "Makefile").read_text())
    assert makefile and dockerfile_args()["TORCH_VERSION"] == makefile[1] == torch.__version__.split("+")[0]
    assert any('"torch==$TORCH_VERSION"' in run for run in instructions("RUN"))


def test_only_the_cuda_image_installs_triton() -> None:
    """triton is the ``gpu`` extra: the GPU worker's image installs it, the CPU image is a CPU install."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [dep for dep in project["dependencies"] if dep.startswith("triton")]
    assert [dep for dep in project["optional-dependencies"]["gpu"] if dep.startswith("triton")]
    [install] = [run for run in instructions("RUN") if re.match(r"pip install \S*\.", run)]
    for name in PAGEDQ_SERVICES:
        echo = install.replace("pip install", "printf %s", 1)
        what = subprocess.run(["sh", "-c", echo], env=build_args(name), capture_output=True, text=True).stdout
        assert what == (".[gpu]" if name == "worker" else "."), (name, what)


def test_the_image_installs_a_c_compiler_for_triton() -> None:
    apt = next(run for run in instructions("RUN") if "apt-get install" in run)
    assert {"gcc", "libc6-dev"} <= set(apt.split())


def dockerignored(path: PurePosixPath, patterns: list[str]) -> bool:
    parts = [PurePosixPath(*path.parts[: i + 1]) for i in range(len(path.parts))]
    return any(
        fnmatch(str(part), pattern) or (pattern.startswith("**/") and fnmatch(part.name, pattern[3:]))
        for part in parts
        for pattern in patterns
    )


def build_context(root: Path) -> Path:
    """The files the Dockerfile COPYs into its WORKDIR, less what .dockerignore keeps out of the context."""
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line for line in lines if line.strip() and not line.startswith("#")]
    workdir = root / instructions("WORKDIR")[-1].lstrip("/")
    for copy in instructions("COPY"):
        *sources, dest = copy.split()
        for source in map(Path, sources):
            files = [REPO / source] if (REPO / source).is_file() else (REPO / source).rglob("*")
            for path in files:
                rel = PurePosixPath(path.relative_to(REPO).as_posix())
                if not path.is_file() or dockerignored(rel, patterns):
                    continue
                if path == REPO / source:  # a file: into dest/ or as dest
                    target = workdir / dest / path.name if dest.endswith("/") else workdir / dest
                else:  # a directory's contents, into dest
                    target = workdir / dest / path.relative_to(REPO / source)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    return workdir


def test_the_image_install_steps_give_a_pagedq_that_runs_every_compose_command(tmp_path: Path) -> None:
    """The CPU image's pip steps, as written, in a fresh venv: the torch pin must already be satisfied by
    the tested torch (so nothing big is fetched), and what ``pip install .`` puts in the image must hold
    every package, migration and subcommand the services use."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    pip = venv / "bin" / "pip"  # this environment's pip, installing into the venv (faster than ensurepip)
    pip.write_text(f'#!/bin/sh\nexec {sys.executable} -m pip --python {venv / "bin" / "python"} "$@"\n')
    pip.chmod(0o755)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "tested_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    workdir = build_context(tmp_path / "context")
    env = {**os.environ, **dockerfile_env(), **build_args("worker-cpu"), "FETCH_DEFAULT_MODEL": "0"}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    env.pop("VIRTUAL_ENV", None)
    steps = [run for run in instructions("RUN") if re.search(r"(^|then|&&)\s*(pip|pagedq) ", run)]
    assert len(steps) == 3
    for step in steps:
        done = subprocess.run(
            ["sh", "-c", step], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{step}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert "Downloading torch" not in done.stdout, step
    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = [pattern.removesuffix("*") for pattern in found["include"]]
    shipped = {f.relative_to(REPO) for p in packages for f in (REPO / p).rglob("*.py")}
    installed = {f.relative_to(site) for p in packages for f in (site / p).rglob("*.py")}
    assert shipped and shipped <= installed, shipped - installed  # every module and migration is in the image
    assert (site / "migrations" / "script.py.mako").is_file()
    commands = [service["command"] for service in PAGEDQ_SERVICES.values()]
    entrypoint = (  # the image's ENTRYPOINT, the installed console script, knows every compose command
        "import sys\nfrom pagedq.cli import build_parser, main\n"
        f"assert sys.modules['pagedq.cli'].__file__.startswith({str(site)!r})\n"
        f"for command in {commands!r}:\n    build_parser().parse_args(command)\n"
    )
    script = (venv / "bin" / "pagedq").read_text()
    assert "from pagedq.cli import main" in script and script.startswith(f"#!{venv / 'bin' / 'python'}")
    done = subprocess.run([venv / "bin" / "python", "-c", entrypoint], cwd=site, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr


# --- the healthchecks, run as compose runs them, on the real services ---

PRETEND_PID_1 = """
import builtins, io, socket
real_open = builtins.open
def pretend_open(path, *args, **kwargs):
    return io.StringIO({cmdline!r}) if path == "/proc/1/cmdline" else real_open(path, *args, **kwargs)
builtins.open = pretend_open
socket.gethostname = lambda: "container"
"""


def healthcheck(service: str, settings: Settings, pid_1: str) -> subprocess.CompletedProcess[str]:
    """The service's healthcheck command, in a process that sees ``pid_1`` as PID 1's command line."""
    test = SERVICES[service]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    cmdline = "\0".join(["/usr/local/bin/python3.11", "/usr/local/bin/pagedq", pid_1, ""])
    return subprocess.run(
        [sys.executable, "-c", PRETEND_PID_1.format(cmdline=cmdline) + test[3]],
        cwd=REPO,
        env=service_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_worker_healthcheck_is_the_workers_own_check(tmp_path: Path) -> None:
    """Compose asks the worker itself (its status file), so a worker that cannot write turns unhealthy."""
    assert SERVICES["worker-cpu"]["healthcheck"] == SERVICES["worker"]["healthcheck"]
    test = SERVICES["worker"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "pagedq"]
    settings = Settings(data_dir=tmp_path, heartbeat_timeout=30)

    def run_check() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "pagedq", *test[2:]]
        return subprocess.run(command, cwd=REPO, env=service_env(settings), capture_output=True, text=True)

    assert run_check().returncode == 1  # no worker has written its status yet
    health = WorkerHealth(settings.resolved_worker_status_file, refresh_every=1.0, worker_id="container:1")
    health.succeeded(jobs=2)
    assert run_check().returncode == 0
    health.failed(OperationalError("UPDATE jobs", {}, Exception("connection refused")))
    done = run_check()
    assert done.returncode == 1 and "cannot write to the database" in done.stdout + done.stderr, done


def test_the_webhooks_healthcheck_needs_its_process_and_the_broker() -> None:
    assert healthcheck("webhooks", Settings(broker_url=redis_url()), "webhooks").returncode == 0
    assert "not pagedq webhooks" in healthcheck("webhooks", Settings(broker_url=redis_url()), "worker").stderr
    unreachable = Settings(broker_url=f"redis://127.0.0.1:{free_port()}/0")
    assert healthcheck("webhooks", unreachable, "webhooks").returncode != 0


@pytest.mark.fast
@pytest.mark.parametrize(
    ("target", "installs_browser"), [("run", False), ("setup", False), ("test", True), ("test-fast", True)]
)
def test_only_the_tests_install_the_browser(target: str, installs_browser: bool) -> None:
    """`make run` must not stop for a sudo password to install a browser only the console's tests use."""
    dry_run = ["make", "-n", "-B", target]  # -B: every recipe, as on a machine that has nothing yet
    recipe = subprocess.run(dry_run, cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert ("apt-get install -y -q chromium" in recipe) == installs_browser, recipe
