"""Grafana dashboards shipped with the kit (the cluster chart deploys them; k8s/observability.py)."""
