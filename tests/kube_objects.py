"""Helpers over rendered Kubernetes objects, shared by the chart and the stack tests."""

from __future__ import annotations

import copy
from typing import Any


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


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies one: objects merge, null deletes, everything
    else (lists) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result
