"""Where committed checkpoints live (a folder or an S3 prefix) and the commit protocol.

A step is a folder `step-<n>` of torch.distributed.checkpoint (DCP) files (dcp_format.py): each
rank's data and its own metadata, and, once every rank's are there, the global metadata that reads
the step at any world size. A rank's part of a step is committed when its manifest exists (`Manifest`:
each of its files' size and CRC32, and the layout it was written at): the files are written in a
folder of the writer's own, fsynced, renamed into the step's folder, and only then the manifest is
written the same way. A kill at any point leaves either a complete, verifiable part or no manifest.
Re-saving a step first removes the old manifest (and the global metadata), so nothing old vouches for
new bytes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import tempfile
import threading
import time
import zlib
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvrx_eks.training.checkpoint.probe import free_space, probe_folder, probe_name
from nvrx_eks.training.checkpoint.shard import ShardError

if TYPE_CHECKING:
    import threading as threading_types
    from collections.abc import Callable, Generator

    from torch.distributed.checkpoint import StorageReader
    from torch.distributed.checkpoint.metadata import Metadata

    from nvrx_eks.training.checkpoint.config import CheckpointConfig
    from nvrx_eks.training.checkpoint.dcp_format import Staged

_STEP_DIR = re.compile(r"^step-(\d{9})$")
_CHUNK = 64 << 20


@dataclass(frozen=True)
class Manifest:
    step: int
    rank: int
    world_size: int
    layout: str
    """The layout the rank's part was written at (dcp_format.py `Staged.key`)."""
    files: dict[str, list[int]] = field(default_factory=dict)
    """File name -> [size, CRC32]."""
    committed_at: float = 0.0

    @property
    def nbytes(self) -> int:
        return sum(size for size, _ in self.files.values())

    @classmethod
    def parse(cls, blob: bytes | str) -> Manifest:
        """A manifest from its JSON; ValueError for anything else (a torn file, an older format)."""
        try:
            raw = json.loads(blob)
            manifest = cls(**raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a manifest: {exc}") from None
        if not manifest.files:
            raise ValueError("a manifest without files")
        return manifest


def step_name(step: int) -> str:
    return f"step-{step:09d}"


def manifest_name(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def _private_name(rank: int) -> str:
    """The prefix of a writer's own folder (and a manifest's temporary) inside a step folder."""
    return f".rank-{rank:05d}.tmp-"


def complete_steps(manifests: dict[int, dict[int, Manifest]]) -> dict[int, int]:
    """step -> the world size it was written at, for every step whose ranks all committed."""
    out = {}
    for step, ranks in manifests.items():
        sizes = {manifest.world_size for manifest in ranks.values()}
        if len(sizes) == 1 and (size := sizes.pop()) and set(ranks) >= set(range(size)):
            out[step] = size
    return out


class ShardStore(ABC):
    """One tier's committed checkpoints."""

    location: str
    """What `open_store` takes to reopen this store (in a writer thread)."""
    shared: bool = True
    """Every node sees the same files (FSx, S3), so any rank can read any rank's part."""

    def __init__(self, *, tier: str) -> None:
        self.tier = tier

    def commit(
        self,
        *,
        step: int,
        rank: int,
        world_size: int,
        staged: Staged,
        cancelled: threading_types.Event | None = None,
    ) -> Manifest:
        """Write this rank's DCP files of `step` and commit them (see the module docstring)."""
        sums = self._write_part(step, rank, staged, cancelled)
        manifest = Manifest(
            step=step,
            rank=rank,
            world_size=world_size,
            layout=staged.key,
            files={name: [size, crc] for name, (size, crc) in sums.items()},
            committed_at=time.time(),
        )
        self._write_manifest(step, rank, json.dumps(asdict(manifest)).encode())
        return manifest

    @abstractmethod
    def _write_part(
        self, step: int, rank: int, staged: Staged, cancelled: threading_types.Event | None
    ) -> dict[str, tuple[int, int]]:
        """This rank's DCP files of `step` in place, after removing the step's old manifest of this rank
        and its global metadata; each file's (size, CRC32) by name."""

    def _write_manifest(self, step: int, rank: int, blob: bytes) -> None:
        """The commit point: written last, so it only ever vouches for files already in place."""
        self.write_file(step, manifest_name(rank), blob)

    @abstractmethod
    def manifests(self, rank: int | None = None) -> dict[int, dict[int, Manifest]]:
        """step -> rank -> manifest of committed parts (of one rank, or of all)."""

    @abstractmethod
    def read_file(self, step: int, name: str) -> bytes:
        """One file of a step, whole; OSError when it cannot be read."""

    @abstractmethod
    def write_file(self, step: int, name: str, data: bytes) -> None:
        """One small file of a step, atomically (the global metadata)."""

    @abstractmethod
    def has_file(self, step: int, name: str) -> bool: ...

    @abstractmethod
    def reader(self, step: int, *, rank: int | None = None) -> StorageReader:
        """DCP's reader of `step`: through the global metadata, or (`rank`) one rank's own files."""

    @abstractmethod
    def delete(self, step: int, rank: int) -> None: ...

    @abstractmethod
    def probe(self) -> str:
        """Prove this store takes a commit, before any rank writes (probe.py): what was found. Raises
        what stopped it."""

    def verify(self, step: int, rank: int) -> Manifest:
        """Every file of `rank`'s part of `step` read back and checked against its manifest; ShardError
        says why it cannot be used."""
        manifest = self.manifests(rank).get(step, {}).get(rank)
        if manifest is None:
            raise ShardError(f"rank {rank} has no committed part of step {step}")
        for name, (size, crc) in manifest.files.items():
            try:
                blob = self.read_file(step, name)
            except OSError as exc:
                raise ShardError(f"{name}: unreadable: {exc}") from exc
            if len(blob) != size:
                raise ShardError(f"{name}: size {len(blob)} != {size} in its manifest (truncated or torn)")
            got = zlib.crc32(blob)
            if got != crc:
                raise ShardError(f"{name}: CRC32 {got:08x} != {crc:08x} in its manifest (corrupt)")
        return manifest

    def finalize(self, step: int, world_size: int) -> bool:
        """Write the global metadata of `step` once every rank's part is committed (merged from the
        ranks' own, dcp_format.py `merge_metadata`): from then on plain `torch.distributed.checkpoint
        .load` reads the step at any world size. False when a part is missing. Idempotent."""
        from nvrx_eks.training.checkpoint.dcp_format import (  # noqa: PLC0415 - torch's DCP, on use
            GLOBAL_METADATA,
            decode_metadata,
            encode_metadata,
            merge_metadata,
            rank_metadata_name,
        )

        if self.has_file(step, GLOBAL_METADATA):
            return True
        manifests = self.manifests().get(step, {})
        if not set(manifests) >= set(range(world_size)):
            return False
        parts: list[Metadata] = []
        for rank in range(world_size):
            name = rank_metadata_name(rank)
            blob = self.read_file(step, name)
            size, crc = manifests[rank].files[name]
            if len(blob) != size or zlib.crc32(blob) != crc:
                raise ShardError(f"step {step}: {name} does not match its manifest")
            parts.append(decode_metadata(blob))
        self.write_file(step, GLOBAL_METADATA, encode_metadata(merge_metadata(parts)))
        return True

    def prune(self, *, rank: int, keep: int, complete: int | None = None) -> list[int]:
        """Delete this rank's parts beyond the newest `keep` steps; returns the steps deleted.

        Retention is job-wide when `complete` is given: the newest step every rank has committed (-1:
        none known). Then only steps older than it are deleted, so the newest complete step stays
        while other ranks may still be committing newer ones: a rank that pruned by its own steps
        alone could delete the last step in common while another rank's part of its newest step is
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


def _write_atomically(path: Path, data: bytes, *, fsync: bool) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_native_id()}")
    with tmp.open("wb") as out:
        out.write(data)
        out.flush()
        if fsync:
            os.fsync(out.fileno())
    tmp.replace(path)


class FileStore(ShardStore):
    """A folder: node-local NVMe (tier 2) or the FSx for Lustre mount (tier 3)."""

    def __init__(self, *, tier: str, root: Path, fsync: bool = True, shared: bool = True) -> None:
        super().__init__(tier=tier)
        self.root = Path(root)
        self.location = str(self.root)
        self.fsync = fsync
        self.shared = shared

    def __repr__(self) -> str:
        return f"FileStore({self.tier}: {self.root})"

    def probe(self) -> str:
        return free_space(probe_folder(self.root, fsync=self.fsync))

    def _write_part(
        self, step: int, rank: int, staged: Staged, cancelled: threading_types.Event | None
    ) -> dict[str, tuple[int, int]]:
        from nvrx_eks.training.checkpoint.dcp_format import GLOBAL_METADATA, write_rank_files  # noqa: PLC0415

        folder = self.root / step_name(step)
        folder.mkdir(parents=True, exist_ok=True)
        # Per writer thread: an abandoned writer (persist.py) may still be writing in its own folder.
        private = folder / f"{_private_name(rank)}{os.getpid()}-{threading.get_native_id()}"
        shutil.rmtree(private, ignore_errors=True)
        private.mkdir()
        try:
            sums = write_rank_files(
                private, staged, rank=rank, final=str(folder), fsync=self.fsync, cancelled=cancelled
            )
            # A step saved again (after a restore): no old manifest or global metadata vouches for it.
            (folder / manifest_name(rank)).unlink(missing_ok=True)
            (folder / GLOBAL_METADATA).unlink(missing_ok=True)
            for name in sums:
                (private / name).replace(folder / name)
        finally:
            shutil.rmtree(private, ignore_errors=True)
        return sums

    def _write_manifest(self, step: int, rank: int, blob: bytes) -> None:
        super()._write_manifest(step, rank, blob)
        if self.fsync:
            _fsync_dir(self.root / step_name(step))

    def manifests(self, rank: int | None = None) -> dict[int, dict[int, Manifest]]:
        out: dict[int, dict[int, Manifest]] = {}
        if not self.root.is_dir():
            return out
        for folder in self.root.iterdir():
            if not _STEP_DIR.match(folder.name):
                continue
            names = [folder / manifest_name(rank)] if rank is not None else _entries(folder, "rank-*.json")
            for path in names:
                try:
                    manifest = Manifest.parse(path.read_bytes())
                except (OSError, ValueError):
                    continue  # missing, or a manifest torn by a filesystem without atomic rename
                out.setdefault(manifest.step, {})[manifest.rank] = manifest
        return out

    def read_file(self, step: int, name: str) -> bytes:
        return (self.root / step_name(step) / name).read_bytes()

    def write_file(self, step: int, name: str, data: bytes) -> None:
        _write_atomically(self.root / step_name(step) / name, data, fsync=self.fsync)

    def has_file(self, step: int, name: str) -> bool:
        return (self.root / step_name(step) / name).is_file()

    def reader(self, step: int, *, rank: int | None = None) -> StorageReader:
        from torch.distributed.checkpoint import FileSystemReader  # noqa: PLC0415

        from nvrx_eks.training.checkpoint.dcp_format import RankReader  # noqa: PLC0415

        folder = self.root / step_name(step)
        return FileSystemReader(folder) if rank is None else RankReader(folder, rank)

    def delete(self, step: int, rank: int) -> None:
        from nvrx_eks.training.checkpoint.dcp_format import (  # noqa: PLC0415
            GLOBAL_METADATA,
            data_name,
            rank_metadata_name,
        )

        folder = self.root / step_name(step)
        # Manifest first: a half-deleted part is never visible as committed.
        (folder / manifest_name(rank)).unlink(missing_ok=True)
        if rank == 0:
            (folder / GLOBAL_METADATA).unlink(missing_ok=True)
        for name in (data_name(rank), rank_metadata_name(rank)):
            (folder / name).unlink(missing_ok=True)
        for stale in _entries(folder, f"{_private_name(rank)}*"):
            shutil.rmtree(stale, ignore_errors=True)
        with contextlib.suppress(OSError):
            folder.rmdir()  # only once every rank's files are gone

    def remove_temporaries(self, rank: int, *, pid: int | None = None) -> list[str]:
        """Remove `rank`'s private writer folders and temporary files (their names carry the writer's
        pid): at a rank's start, those a killed predecessor left (a rank runs one process at a time);
        at its close, those of its own writers it abandoned."""
        if not self.root.is_dir():
            return []
        pattern = f"{_private_name(rank)}*" if pid is None else f"{_private_name(rank)}{pid}-*"
        removed = []
        for folder in self.root.iterdir():
            if not _STEP_DIR.match(folder.name):
                continue
            removed_here = []
            for stale in _entries(folder, pattern):
                shutil.rmtree(stale, ignore_errors=True)
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


class _CrcReader:
    """File-like view of a file being uploaded, computing CRC32 as boto3 reads it."""

    def __init__(self, source: io.BufferedReader) -> None:
        self._source = source
        self.crc = 0
        self.nbytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._source.read(size)
        self.crc = zlib.crc32(data, self.crc)
        self.nbytes += len(data)
        return data


class S3Store(ShardStore):
    """`s3://bucket/prefix`: an object is visible only once its upload completes, so the files are
    the temporary stage and the manifest object, put after them, is the commit. DCP writes a rank's
    files into a local temporary folder first (its writer needs a file system); they are uploaded
    from there, then removed."""

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

    def _write_part(
        self, step: int, rank: int, staged: Staged, cancelled: threading_types.Event | None
    ) -> dict[str, tuple[int, int]]:
        from nvrx_eks.training.checkpoint.dcp_format import GLOBAL_METADATA, write_rank_files  # noqa: PLC0415

        with tempfile.TemporaryDirectory(prefix=f"nvrx-eks-s3-rank{rank}-") as private:
            sums = write_rank_files(
                Path(private),
                staged,
                rank=rank,
                final=f"s3://{self.bucket}/{self._key(step, '')}",
                fsync=False,
                cancelled=cancelled,
            )
            self.client.delete_object(Bucket=self.bucket, Key=self._key(step, manifest_name(rank)))
            self.client.delete_object(Bucket=self.bucket, Key=self._key(step, GLOBAL_METADATA))
            for name in sums:
                with (Path(private) / name).open("rb") as source:
                    self.client.upload_fileobj(_CrcReader(source), self.bucket, self._key(step, name))
        return sums

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
                    manifest = Manifest.parse(
                        self.client.get_object(Bucket=self.bucket, Key=item["Key"])["Body"].read()
                    )
                except ValueError:
                    continue
                out.setdefault(manifest.step, {})[manifest.rank] = manifest
        return out

    def read_file(self, step: int, name: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        try:
            body: bytes = self.client.get_object(Bucket=self.bucket, Key=self._key(step, name))["Body"].read()
        except (BotoCoreError, ClientError) as exc:
            raise OSError(f"s3://{self.bucket}/{self._key(step, name)}: {exc}") from exc
        return body

    def write_file(self, step: int, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(step, name), Body=data)

    def has_file(self, step: int, name: str) -> bool:
        listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self._key(step, name), MaxKeys=1)
        return any(item["Key"] == self._key(step, name) for item in listed.get("Contents", []))

    def reader(self, step: int, *, rank: int | None = None) -> StorageReader:
        from torch.distributed.checkpoint import FileSystemReader  # noqa: PLC0415

        from nvrx_eks.training.checkpoint.dcp_format import RankReader  # noqa: PLC0415

        folder = f"{self._folder}{step_name(step)}"
        reader = FileSystemReader(folder) if rank is None else RankReader(folder, rank)
        reader.fs = _S3ReadFileSystem(self)  # type: ignore[assignment]
        return reader

    def delete(self, step: int, rank: int) -> None:
        from nvrx_eks.training.checkpoint.dcp_format import (  # noqa: PLC0415
            GLOBAL_METADATA,
            data_name,
            rank_metadata_name,
        )

        names = [manifest_name(rank), data_name(rank), rank_metadata_name(rank)]
        if rank == 0:
            names.insert(1, GLOBAL_METADATA)
        for name in names:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(step, name))


class _S3ReadFileSystem:
    """The part of DCP's file system a reader uses, over S3 objects (each read whole, once)."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        self._cache: dict[str, bytes] = {}

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.BytesIO, None, None]:
        if "r" not in mode:
            raise OSError(f"{path}: the S3 reader only reads")
        key = str(path)
        if key not in self._cache:
            body = self.store.client.get_object(Bucket=self.store.bucket, Key=key)["Body"].read()
            self._cache[key] = body
        yield io.BytesIO(self._cache[key])

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return f"{str(path).rstrip('/')}/{suffix}"

    def init_path(self, path: str | os.PathLike[str]) -> str:
        return str(path)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        listed = self.store.client.list_objects_v2(Bucket=self.store.bucket, Prefix=str(path), MaxKeys=1)
        return bool(listed.get("Contents"))


def finalize_newest(store: ShardStore, *, emit: Callable[[str, dict[str, Any]], None]) -> int | None:
    """The global metadata of the store's newest complete step, written if missing (rank 0, at the end
    of training, once every rank's last persist is committed); the step, or None. A failure is
    reported, never raised: the step still reads at its own world size."""
    try:
        complete = complete_steps(store.manifests())
        if not complete:
            return None
        step = max(complete)
        if store.finalize(step, complete[step]):
            return step
    except (OSError, ShardError, ValueError) as exc:
        emit(
            "checkpoint_failed",
            {"tier": store.tier, "error": f"global metadata: {exc}", "retry": "at restore"},
        )
    return None


def open_store(*, tier: str, location: str | Path, fsync: bool = True) -> ShardStore:
    """A FileStore for a path, an S3Store for an `s3://` URL. Node-local disk (`local`) is each node's
    own; every other tier is shared by the job's nodes."""
    text = str(location)
    if text.startswith("s3://"):
        return S3Store(tier=tier, url=text)
    return FileStore(tier=tier, root=Path(text), fsync=fsync, shared=tier != "local")


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
