"""The cluster path: the Serve config validates and names the deployments the app builds."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from inference.config import ConfigError, config_from_dict, load_config
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


_MODEL = {"id": "a", "kind": "text", "weights": "/x"}


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"max_replicas_per_node": 0}, "max_replicas_per_node"),
        ({"max_replicas_per_node": True}, "max_replicas_per_node"),
        ({"max_replicas_per_node": 1.5}, "max_replicas_per_node"),
        ({"autoscaling": [1, 2]}, "must be a mapping"),
        ({"autoscaling": {"max_replica": 2}}, "unknown keys"),
        ({"autoscaling": {"max_replicas": 2, "upscale_delay_s": "10s"}}, "upscale_delay_s"),
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "min_replicas <= max_replicas"),
        ({"autoscaling": {"min_replicas": 0, "max_replicas": 0}}, "max >= 1"),
    ],
)
def test_placement_and_autoscaling_in_the_model_config_are_checked(option: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"models": [{**_MODEL, **option}]})


def test_an_autoscaled_model_keeps_bundles_in_flight_for_its_most_replicas() -> None:
    """The ingress's /embed coalescing sizes itself on the replicas a model may reach, so a model
    scaled up to max_replicas has bundles for every replica (and Serve sees load to scale on)."""
    scaled = {"autoscaling": {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 1}}
    (spec,) = config_from_dict({"models": [{**_MODEL, **scaled, "max_replicas_per_node": 1}]}).models
    assert spec.most_replicas == 3 and spec.bundles_in_flight == 6
    (fixed,) = config_from_dict({"models": [{**_MODEL, "replicas": 2}]}).models
    assert fixed.most_replicas == 2 and fixed.bundles_in_flight == 4 and fixed.autoscaling is None
