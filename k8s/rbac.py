"""A role and its binding to one service account: how every grant of the kit's charts is written."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdk8s_plus_33 import k8s

if TYPE_CHECKING:
    from constructs import Construct

RBAC_API_GROUP = "rbac.authorization.k8s.io"


def grant(
    scope: Construct,
    id: str,  # noqa: A002
    *,
    name: str,
    labels: dict[str, str],
    rules: list[k8s.PolicyRule],
    service_account: str,
    namespace: str,
    cluster_wide: bool,
) -> None:
    """`rules` for the service account `namespace`/`service_account`, through a role named `name` and its
    binding (construct ids `id` and `id-binding`). `cluster_wide`: a ClusterRole, the only kind that can
    grant cluster-scoped resources such as Nodes; else a Role in the service account's namespace."""
    kind = "ClusterRole" if cluster_wide else "Role"
    meta = k8s.ObjectMeta(name=name, namespace=None if cluster_wide else namespace, labels=labels)
    role = k8s.KubeClusterRole if cluster_wide else k8s.KubeRole
    role(scope, id, metadata=meta, rules=rules)
    binding = k8s.KubeClusterRoleBinding if cluster_wide else k8s.KubeRoleBinding
    binding(
        scope,
        f"{id}-binding",
        metadata=meta,
        role_ref=k8s.RoleRef(api_group=RBAC_API_GROUP, kind=kind, name=name),
        subjects=[k8s.Subject(kind="ServiceAccount", name=service_account, namespace=namespace)],
    )
