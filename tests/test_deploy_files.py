"""docker-compose.yml, the Dockerfile and .env.example use only commands and settings that exist.

Docker cannot run here, so these checks keep the deployment files honest against the code.
"""

import re
from pathlib import Path

import yaml

from core.settings import Settings
from pagedq.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
PAGEDQ_SERVICES = {name: s for name, s in SERVICES.items() if s.get("image") == "pagedq:latest"}


def setting_names() -> set[str]:
    return {f"PAGEDQ_{name.upper()}" for name in Settings.model_fields}


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
    env_example = (REPO / ".env.example").read_text()
    names |= set(re.findall(r"^#?\s*(PAGEDQ_[A-Z_]+)=", env_example, flags=re.M))
    names |= set(re.findall(r"\b(PAGEDQ_[A-Z_]+)=", (REPO / "Dockerfile").read_text()))
    assert names and names <= setting_names() | {"PAGEDQ_CACHE_DIR"}, names - setting_names()


def test_the_services_wait_for_what_they_need() -> None:
    assert "healthcheck" in SERVICES["postgres"] and "healthcheck" in SERVICES["redis"]
    assert SERVICES["postgres"]["volumes"] and SERVICES["migrate"]["restart"] == "no"
    for name in ("api", "worker", "worker-cpu", "webhooks"):
        needs = SERVICES[name]["depends_on"]
        assert needs["migrate"]["condition"] == "service_completed_successfully", name
        assert needs["redis"]["condition"] == "service_healthy", name
    gpu = SERVICES["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert SERVICES["worker-cpu"]["environment"]["PAGEDQ_DEVICE"] == "cpu"


def test_the_database_and_broker_urls_point_at_the_compose_services() -> None:
    env = PAGEDQ_SERVICES["api"]["environment"]
    postgres = SERVICES["postgres"]["environment"]
    user, password, db = postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"], postgres["POSTGRES_DB"]
    assert env["PAGEDQ_DATABASE_URL"] == f"postgresql+psycopg://{user}:{password}@postgres:5432/{db}"
    assert env["PAGEDQ_BROKER_URL"].startswith("redis://redis:6379/")
