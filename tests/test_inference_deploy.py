"""The cluster path: the Serve config validates and names the deployments the app builds."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

from inference.config import load_config
from inference.serve_app import INGRESS_NAME, deployment_name

REPO = Path(__file__).resolve().parent.parent


def test_serve_config_validates_and_matches_the_models() -> None:
    from ray.serve.schema import ServeDeploySchema

    raw = yaml.safe_load((REPO / "inference" / "serve_config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(raw)
    (app,) = schema.applications
    assert app.import_path == "inference.serve_app:app_builder"
    config = load_config(REPO / app.args["config"], environ={})
    expected = {INGRESS_NAME} | {deployment_name(m.id) for m in config.models}
    assert {d.name for d in app.deployments} == expected
    for deployment in app.deployments:
        if deployment.name != INGRESS_NAME:
            assert 0 < deployment.ray_actor_options.num_gpus < 1  # fractional: models share a GPU
            # autoscaled on ongoing requests, one replica per node so replicas spread over nodes
            assert deployment.num_replicas == "auto" and deployment.max_replicas_per_node == 1
            scaling = deployment.autoscaling_config
            assert scaling["min_replicas"] == 1 < scaling["max_replicas"], scaling
            assert scaling["target_ongoing_requests"] > 0, scaling


def test_gpu_image_ships_every_package_and_runs_the_sidecar() -> None:
    dockerfile = (REPO / "Dockerfile.gpu").read_text()
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for top in {p.split(".")[0] for p in packages}:
        assert f"COPY {top} ./{top}" in dockerfile
    assert 'CMD ["mnemo", "sidecar"]' in dockerfile
    assert "RAG_SIDECAR_CONFIG=/app/inference/models.yaml" in dockerfile
