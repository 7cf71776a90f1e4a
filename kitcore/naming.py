"""The rules Kubernetes and S3 apply to names, written once for the cluster config (infra/config.py)
and the job values (k8s/values.py): both name the same namespace, service account, PVC, labels and
bucket, so a name one accepts the other must accept too.

Each check returns None when the value is acceptable, else one sentence naming the value and the rule;
the caller raises it as its field's message. Only documented rules are encoded (sources beside each).
"""

from __future__ import annotations

import re

# -- Kubernetes object names, labels and taints ---------------------------------------------------
# https://kubernetes.io/docs/concepts/overview/working-with-objects/names/
# https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set
# (k8s.io/apimachinery/pkg/util/validation: the API server applies the same rules; checked before a
# render or a deploy so a bad name is a field error, not a rejected apply.)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_LABEL_MAX = 63
"""Namespaces (and every name that becomes a hostname)."""
DNS_SUBDOMAIN_MAX = 253
"""ServiceAccount, Secret, PersistentVolumeClaim, PriorityClass names; a label key's prefix."""
LABEL_MAX = 63
"""A label value; a label or taint key's name part."""


def dns_label_problem(value: str, *, max_length: int = DNS_LABEL_MAX) -> str | None:
    """A namespace (or a name that becomes part of a hostname, with a lower `max_length`)."""
    if len(value) > max_length or not _DNS_LABEL.match(value):
        return (
            f"{value!r} must be a DNS label: lowercase letters, digits and '-', starting and ending with "
            f"a letter or digit, at most {max_length} characters"
        )
    return None


def dns_subdomain_problem(value: str) -> str | None:
    """An object name: ServiceAccount, Secret, PVC, PriorityClass."""
    if len(value) > DNS_SUBDOMAIN_MAX or not _DNS_SUBDOMAIN.match(value):
        return (
            f"{value!r} is not a Kubernetes name (DNS subdomain): lowercase letters, digits, '-' and '.', "
            f"starting and ending with a letter or digit, at most {DNS_SUBDOMAIN_MAX} characters"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """A label value or a taint value (empty is allowed)."""
    if len(value) > LABEL_MAX or not _LABEL_VALUE.match(value):
        return (
            f"{value!r} is not a Kubernetes label value: at most {LABEL_MAX} letters, digits, '-', '_' "
            "and '.', starting and ending with a letter or digit (or empty)"
        )
    return None


def qualified_name_problem(key: str, *, kind: str = "label key") -> str | None:
    """A label or taint key: [DNS subdomain prefix '/'] name."""
    prefix, slash, name = key.rpartition("/")
    if "/" in prefix:
        return f"{kind} {key!r} has more than one '/'; use [prefix/]name, e.g. example.com/pool"
    if slash and (not prefix or len(prefix) > DNS_SUBDOMAIN_MAX or not _DNS_SUBDOMAIN.match(prefix)):
        return f"{kind} {key!r}: the prefix {prefix!r} must be a lowercase DNS subdomain (e.g. example.com)"
    if not name or len(name) > LABEL_MAX or not _LABEL_VALUE.match(name):
        return (
            f"{kind} {key!r}: the name {name!r} must be 1-{LABEL_MAX} letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    return None


# -- S3 -------------------------------------------------------------------------------------------
# General purpose bucket naming rules:
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html

_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_S3_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_S3_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
# "Must not be formatted as an IP address (for example, 192.168.5.4)": the form, not a valid address.
_IPV4_FORM = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")


def s3_bucket_problem(name: str) -> str | None:
    problem = None
    if not _S3_BUCKET.match(name):
        problem = "3-63 lowercase letters, digits, '.' and '-', starting and ending with a letter or digit"
    elif ".." in name or ".-" in name or "-." in name:
        problem = "no two adjacent periods ('..'), and no period next to a hyphen"
    elif _IPV4_FORM.match(name):
        problem = "not formatted as an IP address"
    elif name.startswith(_S3_RESERVED_PREFIXES) or name.endswith(_S3_RESERVED_SUFFIXES):
        problem = "not a reserved prefix (xn--, sthree-, amzn-s3-demo-) or suffix (-s3alias, --ol-s3, ...)"
    return f"{name!r} is not an S3 bucket name: {problem}" if problem else None
