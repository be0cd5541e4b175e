"""Joining the Ray cluster a bulk job runs on (``--ray ADDRESS`` of the image job and the backfill)."""

from __future__ import annotations

__all__ = ["connect"]


def connect(address: str) -> None:
    """Join the cluster at ``address`` unless this process already has; ``"local"`` starts a
    single-node Ray here (without its dashboard, which a batch job does not need), as the sidecar
    does: tried again when its raylet registers late on a loaded machine
    (:func:`inference.ray_local.start_local_ray`)."""
    import ray

    if ray.is_initialized():
        return
    if address == "local":
        from inference.ray_local import start_local_ray

        start_local_ray(include_dashboard=False)
    else:
        ray.init(address=address)
