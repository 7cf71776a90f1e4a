"""Can a checkpoint tier start on this node? The probe of its location, and what a failure says.

A probe does what the checkpointer's start and first commit do to a tier, with a probe file in place
of a shard: a folder is created as a commit creates its step folder (`probe_folder`), and a file is
written, fsynced where the tier fsyncs, and removed; an S3 prefix is listed, then an object put and
deleted with the store's own client (storage.py `ShardStore.probe`). The probe's name starts with
`PROBE_PREFIX`, which no restore reads (step folders, rank files, slot files), and it is removed at
once, so nothing left in a checkpoint folder can pass for a checkpoint.

A failure is one `TierProbe` naming the tier, its path or URL, the cause and the fix, in words a pod's
status can carry (training/node/selfcheck.py prints it; factory.py `probe_checkpointer` probes every
tier of a configuration). Torch-free: the node check (training/node/nodecheck.py) probes the NVMe array
with `probe_folder`, in a DaemonSet that must stay small.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

PROBE_PREFIX = ".nvrx-eks-probe-"
"""Every probe file and object starts with it: no checkpoint's name does."""
PROBE_BYTES = 4096
_GIB = 1 << 30


def probe_name() -> str:
    """A probe's name, unique to this process: probes of two pods on one shared folder never collide."""
    return f"{PROBE_PREFIX}{socket.gethostname()}-{os.getpid()}"


def probe_folder(folder: Path, *, fsync: bool) -> int:
    """Create `folder` (and its parents) as a commit does, write a probe file in it, fsync it when
    `fsync`, remove it; the folder's free bytes. Raises the OSError that stopped it."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, prefix=probe_name()) as probe:
        probe.write(b"\0" * PROBE_BYTES)
        probe.flush()
        if fsync:
            os.fsync(probe.fileno())
    return shutil.disk_usage(folder).free


def free_space(free_bytes: int) -> str:
    return f"writable, {free_bytes / _GIB:.1f} GiB free"


@dataclass(frozen=True, kw_only=True)
class TierProbe:
    """One tier (or the implementation itself) proven on this node, or why not."""

    tier: str
    """`memory`, `local`, `durable`, or `implementation` (the checkpointer's modules)."""
    location: str
    """The tier's folder or s3:// URL (the implementation's: its name)."""
    detail: str
    """What was found (free space), or the cause and the fix."""
    ok: bool
    node_local: bool = False
    """The location is this node's own disk: a failure is this node's, and another node may well
    succeed. Every other location is the pod's or shared by all pods, so all of them would fail alike."""


def failed(tier: str, location: str, exc: BaseException, *, node_local: bool = False) -> TierProbe:
    """The tier at `location` cannot start: `exc` as its cause, with the fix."""
    if isinstance(exc, OSError):
        cause, fix = _folder_problem(exc, location=location, field=f"{tier}_dir")
    else:
        cause, fix = _s3_problem(exc)
    return TierProbe(tier=tier, location=location, detail=f"{cause}; {fix}", ok=False, node_local=node_local)


def unimportable(implementation: str, exc: ImportError) -> TierProbe:
    """The checkpointer `implementation` cannot be imported: the image lacks what it needs."""
    return TierProbe(
        tier="implementation",
        location=f"checkpoint.implementation={implementation}",
        detail=f"cannot be imported ({exc}); the image lacks a module it needs: rebuild it from the "
        "kit's locks",
        ok=False,
    )


_FOLDER_FIXES = {
    errno.EACCES: "make it writable by uid {uid}, the trainer's user",
    errno.EPERM: "make it writable by uid {uid}, the trainer's user",
    errno.EROFS: "mount it read-write",
    errno.ENOSPC: "free space on its filesystem",
    errno.EDQUOT: "free space or raise the quota",
    errno.ENOTDIR: "remove the file that stands in its path",
    errno.EEXIST: "remove the file that stands in its path",
}


def _folder_problem(exc: OSError, *, location: str, field: str) -> tuple[str, str]:
    uid = os.getuid()
    cause = exc.strerror or str(exc)
    if exc.errno in {errno.EACCES, errno.EPERM}:
        cause += f" for uid {uid}"
    if exc.filename and str(exc.filename) != location:
        cause += f" ({exc.filename})"
    fix = _FOLDER_FIXES.get(exc.errno or 0, "make it a folder the trainer can write").format(uid=uid)
    return cause, f"{fix}, or point checkpoint.{field} at another folder"


def _s3_problem(exc: BaseException) -> tuple[str, str]:
    """botocore's errors, by name and code (botocore is imported only where a tier is on S3)."""
    kind = type(exc).__name__
    code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
    if kind in {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}:
        fix = "give the trainer AWS credentials (on EKS: an IAM role for the trainer's service account)"
    elif code in {"NoSuchBucket", "404"}:
        fix = "create the bucket, or correct checkpoint.durable_dir"
    elif code in {"AccessDenied", "403", "AllAccessDisabled"}:
        fix = (
            "allow s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject on it to the "
            "trainer's IAM role"
        )
    else:
        fix = "check checkpoint.durable_dir and the trainer's access to S3"
    return f"{kind}: {exc}", fix
