"""Where committed shards live (a folder or an S3 prefix) and the commit protocol.

A rank's shard for a step is committed when its manifest (size + CRC32 of the shard) exists: the
shard is written under a temporary name, flushed and fsynced, renamed, and only then the manifest is
written the same way. A kill at any point leaves either a complete, verifiable shard or no manifest.
Re-saving a step first removes the old manifest, so an old manifest never vouches for new bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
import zlib
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvrx_eks.training.checkpoint.probe import free_space, probe_folder, probe_name
from nvrx_eks.training.checkpoint.shard import ShardError, decode

if TYPE_CHECKING:
    from collections.abc import Iterable

    from nvrx_eks.training.checkpoint.config import CheckpointConfig

_STEP_DIR = re.compile(r"^step-(\d{9})$")
_CHUNK = 64 << 20


@dataclass(frozen=True)
class Manifest:
    step: int
    rank: int
    world_size: int
    nbytes: int
    crc32: int
    committed_at: float


def step_name(step: int) -> str:
    return f"step-{step:09d}"


def shard_name(rank: int) -> str:
    return f"rank-{rank:05d}.shard"


def manifest_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


class ShardStore(ABC):
    """One tier's committed shards."""

    location: str
    """What `open_store` takes to reopen this store (in a writer thread)."""

    def __init__(self, *, tier: str) -> None:
        self.tier = tier

    @abstractmethod
    def commit(
        self, *, step: int, rank: int, world_size: int, chunks: Iterable[memoryview | bytes]
    ) -> Manifest:
        """Write a shard from its byte chunks and commit it (see the module docstring)."""

    @abstractmethod
    def manifests(self, rank: int | None = None) -> dict[int, dict[int, Manifest]]:
        """step -> rank -> manifest of committed shards (of one rank, or of all)."""

    @abstractmethod
    def read_bytes(self, step: int, rank: int) -> tuple[bytearray, Manifest]: ...

    @abstractmethod
    def delete(self, step: int, rank: int) -> None: ...

    @abstractmethod
    def probe(self) -> str:
        """Prove this store takes a commit, before any rank writes (probe.py): what was found. Raises
        what stopped it."""

    def read(self, step: int, rank: int) -> dict[str, Any]:
        """The verified state of one shard; ShardError says why it cannot be used."""
        blob, manifest = self.read_bytes(step, rank)
        if len(blob) != manifest.nbytes:
            raise ShardError(f"size {len(blob)} != {manifest.nbytes} in its manifest (truncated or torn)")
        crc = zlib.crc32(blob)
        if crc != manifest.crc32:
            raise ShardError(f"CRC32 {crc:08x} != {manifest.crc32:08x} in its manifest (corrupt)")
        return decode(blob)

    def prune(self, *, rank: int, keep: int, complete: int | None = None) -> list[int]:
        """Delete this rank's shards beyond the newest `keep` steps; returns the steps deleted.

        Retention is job-wide when `complete` is given: the newest step every rank has committed (-1:
        none known). Then only steps older than it are deleted, so the newest complete step stays
        while other ranks may still be committing newer ones: a rank that pruned by its own steps
        alone could delete the last step in common while another rank's shard of its newest step is
        still being written (no complete step on disk for that while). An incomplete step older than
        the newest complete one goes like any older step."""
        steps = sorted(self.manifests(rank))
        doomed = steps[:-keep] if keep else steps
        if complete is not None:
            doomed = [step for step in doomed if step < complete]
        for step in doomed:
            self.delete(step, rank)
        return doomed

    def remove_temporaries(self, rank: int, *, pid: int | None = None) -> list[str]:  # noqa: ARG002
        """Remove `rank`'s temporary files (of writer process `pid`; None: of any process). Nothing
        to do where an object appears only once complete (S3)."""
        return []


def _entries(folder: Path, pattern: str) -> list[Path]:
    """`folder.glob(pattern)`, empty once the folder is gone. Ranks of one node share a tier's step
    folders and the last one out removes a folder: pathlib checks the folder exists, then lists it,
    and a removal between the two raises FileNotFoundError (Python 3.11), which would fail a prune
    or a commit whose step folder another rank was just emptying."""
    try:
        return list(folder.glob(pattern))
    except FileNotFoundError:
        return []


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore(ShardStore):
    """A folder: node-local NVMe (tier 2) or the FSx for Lustre mount (tier 3)."""

    def __init__(self, *, tier: str, root: Path, fsync: bool = True) -> None:
        super().__init__(tier=tier)
        self.root = Path(root)
        self.location = str(self.root)
        self.fsync = fsync

    def __repr__(self) -> str:
        return f"FileStore({self.tier}: {self.root})"

    def probe(self) -> str:
        return free_space(probe_folder(self.root, fsync=self.fsync))

    def commit(
        self, *, step: int, rank: int, world_size: int, chunks: Iterable[memoryview | bytes]
    ) -> Manifest:
        folder = self.root / step_name(step)
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / shard_name(rank)
        final_manifest = folder / manifest_name(rank)
        # Per writer thread: an abandoned writer (persist.py) may still be writing its own tmp file.
        tmp = folder / f".{shard_name(rank)}.tmp-{os.getpid()}-{threading.get_native_id()}"
        crc = 0
        nbytes = 0
        try:
            with tmp.open("wb", buffering=0) as out:
                for chunk in chunks:
                    view = memoryview(chunk).cast("B")
                    for start in range(0, len(view), _CHUNK):
                        part = view[start : start + _CHUNK]
                        crc = zlib.crc32(part, crc)
                        written = out.write(part)
                        while written < len(part):  # short writes happen on some filesystems
                            written += out.write(part[written:])
                        nbytes += len(part)
                if self.fsync:
                    os.fsync(out.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)  # nothing was renamed: the step stays uncommitted
            raise
        manifest = Manifest(step, rank, world_size, nbytes, crc, time.time())
        final_manifest.unlink(missing_ok=True)
        tmp.replace(final)
        tmp_manifest = folder / f".{manifest_name(rank)}.tmp-{os.getpid()}"
        with tmp_manifest.open("w") as out:
            json.dump(asdict(manifest), out)
            out.flush()
            if self.fsync:
                os.fsync(out.fileno())
        tmp_manifest.replace(final_manifest)
        if self.fsync:
            _fsync_dir(folder)
        return manifest

    def manifests(self, rank: int | None = None) -> dict[int, dict[int, Manifest]]:
        out: dict[int, dict[int, Manifest]] = {}
        if not self.root.is_dir():
            return out
        for folder in self.root.iterdir():
            match = _STEP_DIR.match(folder.name)
            if not match:
                continue
            names = [folder / manifest_name(rank)] if rank is not None else _entries(folder, "rank-*.json")
            for path in names:
                try:
                    manifest = Manifest(**json.loads(path.read_text()))
                except (OSError, ValueError, TypeError):
                    continue  # missing, or a manifest torn by a filesystem without atomic rename
                out.setdefault(manifest.step, {})[manifest.rank] = manifest
        return out

    def read_bytes(self, step: int, rank: int) -> tuple[bytearray, Manifest]:
        folder = self.root / step_name(step)
        try:
            manifest = Manifest(**json.loads((folder / manifest_name(rank)).read_text()))
            path = folder / shard_name(rank)
            blob = bytearray(path.stat().st_size)
            with path.open("rb", buffering=0) as source:
                got = 0
                view = memoryview(blob)
                while got < len(blob):
                    n = source.readinto(view[got:])
                    if not n:
                        break
                    got += n
        except (OSError, ValueError, TypeError) as exc:
            raise ShardError(f"unreadable: {exc}") from exc
        return blob, manifest

    def delete(self, step: int, rank: int) -> None:
        folder = self.root / step_name(step)
        # Manifest first: a half-deleted shard is never visible as committed.
        (folder / manifest_name(rank)).unlink(missing_ok=True)
        (folder / shard_name(rank)).unlink(missing_ok=True)
        for stale in _entries(folder, f".{shard_name(rank)}.tmp-*"):
            stale.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()  # only once every rank's files are gone

    def remove_temporaries(self, rank: int, *, pid: int | None = None) -> list[str]:
        """Remove `rank`'s temporary shard and manifest files (`commit`'s names carry the writer's
        pid): at a rank's start, those a killed predecessor left (a rank runs one process at a time);
        at its close, those of its own writers it abandoned."""
        if not self.root.is_dir():
            return []
        patterns = (
            [f".{shard_name(rank)}.tmp-*", f".{manifest_name(rank)}.tmp-*"]
            if pid is None
            else [f".{shard_name(rank)}.tmp-{pid}-*", f".{manifest_name(rank)}.tmp-{pid}"]
        )
        removed = []
        for folder in self.root.iterdir():
            if not _STEP_DIR.match(folder.name):
                continue
            removed_here = []
            for pattern in patterns:
                for stale in _entries(folder, pattern):
                    with contextlib.suppress(OSError):
                        stale.unlink()
                        removed_here.append(str(stale))
            if removed_here:
                # A step no rank committed: only its temporaries were there. Only folders this call
                # emptied: an empty folder may be one another rank has just made for its commit.
                with contextlib.suppress(OSError):
                    folder.rmdir()
            removed += removed_here
        return removed

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class _ChunkReader:
    """File-like view of a chunk iterator, computing CRC32 as boto3 reads it."""

    def __init__(self, chunks: Iterable[memoryview | bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")
        self.crc = 0
        self.nbytes = 0

    def read(self, size: int = -1) -> bytes:
        parts = []
        want = size if size >= 0 else float("inf")
        got = 0
        while got < want:
            if not self._pending:
                try:
                    self._pending = memoryview(next(self._chunks)).cast("B")
                except StopIteration:
                    break
            take = self._pending[: int(min(want - got, len(self._pending)))]
            self._pending = self._pending[len(take) :]
            parts.append(bytes(take))
            got += len(take)
        data = b"".join(parts)
        self.crc = zlib.crc32(data, self.crc)
        self.nbytes += len(data)
        return data


class S3Store(ShardStore):
    """`s3://bucket/prefix`: an object is visible only once its upload completes, so the shard object
    is the temporary stage and the manifest object, put after it, is the commit."""

    # `client`: boto3's S3 client (or a test's stand-in); boto3 builds its classes at run time and ships
    # no types, so the checker sees it as Any whichever way it is spelled.
    def __init__(self, *, tier: str, url: str, client: Any = None) -> None:  # noqa: ANN401
        super().__init__(tier=tier)
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.location = url
        if client is None:
            import boto3  # noqa: PLC0415 - only S3 users pay for the import

            client = boto3.client("s3")
        self.client = client

    def __repr__(self) -> str:
        return f"S3Store({self.tier}: s3://{self.bucket}/{self.prefix})"

    def _key(self, step: int, name: str) -> str:
        return "/".join(part for part in (self.prefix, step_name(step), name) if part)

    @property
    def _folder(self) -> str:
        """The listing prefix of the store's keys."""
        return f"{self.prefix}/" if self.prefix else ""

    def probe(self) -> str:
        """List the prefix (a restore's first call), then put and delete a probe object (a commit's)."""
        self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._folder, MaxKeys=1)
        key = "/".join(part for part in (self.prefix, probe_name()) if part)
        self.client.put_object(Bucket=self.bucket, Key=key, Body=b"")
        self.client.delete_object(Bucket=self.bucket, Key=key)
        return f"listed, written and deleted (region {self.client.meta.region_name})"

    def commit(
        self, *, step: int, rank: int, world_size: int, chunks: Iterable[memoryview | bytes]
    ) -> Manifest:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(step, manifest_name(rank)))
        reader = _ChunkReader(chunks)
        self.client.upload_fileobj(reader, self.bucket, self._key(step, shard_name(rank)))
        manifest = Manifest(step, rank, world_size, reader.nbytes, reader.crc, time.time())
        self.client.put_object(
            Bucket=self.bucket,
            Key=self._key(step, manifest_name(rank)),
            Body=json.dumps(asdict(manifest)).encode(),
        )
        return manifest

    def manifests(self, rank: int | None = None) -> dict[int, dict[int, Manifest]]:
        out: dict[int, dict[int, Manifest]] = {}
        paginator = self.client.get_paginator("list_objects_v2")
        wanted = manifest_name(rank) if rank is not None else None
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self._folder):
            for item in page.get("Contents", []):
                name = item["Key"].rsplit("/", 1)[-1]
                if not (name.startswith("rank-") and name.endswith(".json")):
                    continue
                if wanted is not None and name != wanted:
                    continue
                try:
                    body = self.client.get_object(Bucket=self.bucket, Key=item["Key"])["Body"].read()
                    manifest = Manifest(**json.loads(body))
                except (ValueError, TypeError):
                    continue
                out.setdefault(manifest.step, {})[manifest.rank] = manifest
        return out

    def read_bytes(self, step: int, rank: int) -> tuple[bytearray, Manifest]:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(step, manifest_name(rank)))
            manifest = Manifest(**json.loads(body["Body"].read()))
            obj = self.client.get_object(Bucket=self.bucket, Key=self._key(step, shard_name(rank)))
            blob = bytearray(obj["Body"].read())
        except (BotoCoreError, ClientError, ValueError, TypeError) as exc:
            raise ShardError(f"unreadable: {exc}") from exc
        return blob, manifest

    def delete(self, step: int, rank: int) -> None:
        for name in (manifest_name(rank), shard_name(rank)):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(step, name))


def open_store(*, tier: str, location: str | Path, fsync: bool = True) -> ShardStore:
    """A FileStore for a path, an S3Store for an `s3://` URL."""
    text = str(location)
    if text.startswith("s3://"):
        return S3Store(tier=tier, url=text)
    return FileStore(tier=tier, root=Path(text), fsync=fsync)


def disk_stores(config: CheckpointConfig) -> list[tuple[ShardStore, int, bool]]:
    """(store, cadence, shared between nodes) for tiers 2 and 3, fastest first."""
    out: list[tuple[ShardStore, int, bool]] = []
    if config.local_dir is not None and config.local_every:
        out.append(
            (
                open_store(tier="local", location=config.local_dir, fsync=config.fsync),
                config.local_every,
                False,
            )
        )
    if config.durable_dir and config.durable_every:
        out.append(
            (
                open_store(tier="durable", location=config.durable_dir, fsync=config.fsync),
                config.durable_every,
                True,
            )
        )
    return out
