"""The Kubernetes examples (deploy/k8s/, docs/scale-out.md) agree with the models file they mount: every
worker serves a listed model, and KEDA scales each on that model's queue-depth metric."""

import re
from pathlib import Path

import pytest
import yaml

from core.served_models import parse_models

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
pytestmark = pytest.mark.fast


def manifests() -> list[dict]:
    return [doc for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_workers_and_scaled_objects_name_the_models_of_the_mounted_models_file(tmp_path: Path) -> None:
    docs = manifests()
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "pagedq-models")
    models_file = tmp_path / "models.toml"
    models_file.write_text(config["data"]["models.toml"])
    models = {entry.name: entry for entry in parse_models(str(models_file))}
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    served_by = {}
    for name, deployment in deployments.items():
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        if args[0] == "worker":
            served_by[name] = args[args.index("--model") + 1]
    assert set(served_by.values()) == set(models)  # every model has its workers, and no worker is stray

    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    assert scaled
    for scaler in scaled:
        target = scaler["spec"]["scaleTargetRef"]["name"]
        (trigger,) = scaler["spec"]["triggers"]
        metric = re.fullmatch(r'max\(pagedq_queue_depth\{model="([^"]+)"\}\)', trigger["metadata"]["query"])
        assert metric and metric.group(1) == served_by[target]
        # Scaled from zero, so /readyz must not wait for one of its workers.
        assert models[served_by[target]].workers == 0 and scaler["spec"]["minReplicaCount"] == 0
