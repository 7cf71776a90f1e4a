"""Helpers over rendered Kubernetes objects, shared by the chart and the stack tests."""

from __future__ import annotations


def container_images(node: object) -> list[str]:
    """The image of every container, init container and ephemeral container anywhere under `node`."""
    if isinstance(node, list):
        return [image for item in node for image in container_images(item)]
    if not isinstance(node, dict):
        return []
    found = [
        c["image"]
        for key in ("containers", "initContainers", "ephemeralContainers")
        for c in node.get(key, [])
    ]
    return found + container_images(list(node.values()))
