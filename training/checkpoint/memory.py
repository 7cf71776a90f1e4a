"""The memory tier: this rank's staging slots in host memory, and the copy that fills them behind the loop.

`num_staging_slots` pre-allocated, pre-faulted buffers per rank, each a slot file (slot.py) in a
shared-memory folder mapped into the process (pinned with cudaHostRegister on GPU). A slot is committed
by a small manifest written after the copy, so it survives a kill -9 of the rank: the restarted rank on
the same node restores from RAM. The disk tiers and the peer replica are written from the slots
(tiered.py hands them out).

Off the critical path: parameters and optimizer state change only in the optimizer update, so the
snapshot taken after step N is copied while step N+1's forward/backward run, and `fence()` (called by
the loop right before step N+1's update) waits only for what is left of it. On CPU the copy runs on
one background thread (`Tensor.copy_` releases the GIL); on GPU it is a side CUDA stream filling the
pinned slot, and fence makes the update's stream wait on the copy's event (the host does not wait).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from nvrx_eks.training.checkpoint.shard import Layout, views
from nvrx_eks.training.checkpoint.slot import SlotFiles

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


@dataclass
class Slot:
    """One staging slot: its files, the mapped buffer, and who reads it (it is never overwritten then)."""

    index: int
    files: SlotFiles
    buffer: torch.Tensor | None = None
    targets: list[torch.Tensor] = field(default_factory=list)
    """Typed views of `buffer`, one per tensor of the layout (made once per layout, not per save)."""
    step: int = -1
    holders: set[str] = field(default_factory=set)
    """Tiers whose worker is reading this slot: it must not be overwritten."""
    pending_event: Any = None
    """GPU: the copy's CUDA event; the slot commits once it completes."""
    pending_copy: Future[None] | None = None
    """CPU: the background copy (and commit) of this slot."""
    pending_header: bytes = b""
    submitted: set[str] = field(default_factory=set)
    """Holders handed this slot before its copy finished (the peer replica waits for the copy itself)."""
    plan: Any = None
    """The DCP write plan of the snapshot in it (dcp_format.py `Staged.plan`): a disk persist writes it."""

    @property
    def pending(self) -> bool:
        return self.pending_event is not None or self.pending_copy is not None


class MemoryTier:
    """This rank's staging slots in a shared-memory folder, and the memory tier's commit protocol."""

    tier = "memory"

    def __init__(
        self, *, root: Path, rank: int, world_size: int, num_slots: int, device: torch.device
    ) -> None:
        self.root = root / f"rank-{rank:05d}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.slots = [Slot(i, SlotFiles.at(self.root, i)) for i in range(num_slots)]
        self.signature: Any = None
        self.data_bytes = 0
        self._stream: Any = None
        self._unfenced: list[Any] = []
        """GPU: copy events the update's stream has not been told to wait for yet."""
        self._copier: ThreadPoolExecutor | None = None
        self.copy_errors: list[str] = []

    # --- restore side -------------------------------------------------------------------------
    def committed_steps(self) -> set[int]:
        """Steps this rank's slots hold committed (restore.py reads the slots themselves)."""
        return {
            int(manifest["step"])
            for slot in self.slots
            if (manifest := slot.files.read_manifest()) is not None and manifest.get("rank") == self.rank
        }

    # --- save side ----------------------------------------------------------------------------
    def ensure(self, layout: Layout) -> None:
        """(Re)allocate the slots for this layout: sized files in shared memory, mapped and
        pre-faulted: a fresh allocation per save pays the page faults a reused buffer paid once
        (`nvrx-eks bench checkpoint` measures the copy against that floor)."""
        if layout.signature == self.signature:
            return
        self.release()
        nbytes = max(layout.data_bytes, 1)
        for slot in self.slots:
            slot.files.uncommit()  # old contents are superseded from here on
            with slot.files.data.open("wb") as out:
                out.truncate(nbytes)
            slot.buffer = torch.from_file(str(slot.files.data), shared=True, size=nbytes, dtype=torch.uint8)
            slot.buffer.zero_()  # touch every page now, not inside the first save
            slot.targets = views(slot.buffer, layout)  # equal signatures, equal offsets
            if self.device.type == "cuda":
                # Pinned staging: page-locked memory is what lets the D2H copy run at full PCIe speed
                # asynchronously. Registering the mapping keeps the file shareable with the writer thread.
                rc = torch.cuda.cudart().cudaHostRegister(slot.buffer.data_ptr(), nbytes, 0)
                if int(rc) != 0:
                    raise RuntimeError(f"cudaHostRegister failed ({rc})")
            slot.step = -1
        self.signature = layout.signature
        self.data_bytes = layout.data_bytes

    def release(self) -> None:
        self.synchronize()
        self.complete_pending()
        if self._copier is not None:
            self._copier.shutdown(wait=True)
            self._copier = None
        for slot in self.slots:
            if slot.buffer is not None and self.device.type == "cuda":
                torch.cuda.cudart().cudaHostUnregister(slot.buffer.data_ptr())
            slot.buffer = None
            slot.targets = []

    def free_slot(self) -> Slot | None:
        """An unheld slot, the oldest first (the newest snapshot stays valid while the next is copied)."""
        free = [slot for slot in self.slots if not slot.holders and not slot.pending]
        return min(free, key=lambda slot: slot.step) if free else None

    def unheld(self) -> int:
        """Slots no persist reads (a slot still being copied counts: its copy ends by the fence)."""
        return sum(1 for slot in self.slots if not slot.holders)

    def stage(self, slot: Slot, step: int, tensors: list[torch.Tensor], header: bytes) -> None:
        """Start copying `tensors` (of the layout `ensure` allocated for) into `slot`; returns at once.
        The slot commits when the copy ends."""
        slot.files.uncommit()
        slot.step = step
        slot.pending_header = header
        slot.submitted.clear()
        targets = slot.targets
        sources = [tensor.detach() for tensor in tensors]
        if self.device.type == "cuda":
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=self.device)
            # The copy starts after the kernels that produced step N's state (its update)...
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                for target, source in zip(targets, sources, strict=True):
                    target.copy_(source, non_blocking=True)
                    if source.is_cuda:
                        source.record_stream(self._stream)
                event = torch.cuda.Event()
                event.record(self._stream)
            # ...and overlaps step N+1's forward/backward: only the next update waits for it (fence).
            slot.pending_event = event
            self._unfenced.append(event)
            return
        if self._copier is None:
            self._copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-copy")
        slot.pending_copy = self._copier.submit(self._copy_and_commit, slot, step, targets, sources, header)

    def _copy_and_commit(
        self, slot: Slot, step: int, targets: list[torch.Tensor], sources: list[torch.Tensor], header: bytes
    ) -> None:
        """Copy thread: one `copy_` per tensor (it releases the GIL), then the slot's commit."""
        with torch.no_grad():
            for target, source in zip(targets, sources, strict=True):
                target.copy_(source)
        self._commit(slot, step, header)

    def copy_waiter(self, slot: Slot) -> Callable[[], None]:
        """A call that returns once `slot`'s copy has finished (raises if it failed), from any thread."""
        copy, event = slot.pending_copy, slot.pending_event
        if copy is not None:
            return copy.result
        if event is not None:
            synchronize: Callable[[], None] = event.synchronize
            return synchronize
        return lambda: None

    def fence(self, *, block: bool = True) -> None:
        """Wait (CPU) or order the update stream (GPU) after every copy started so far."""
        if self._unfenced:
            stream = torch.cuda.current_stream(self.device)
            for event in self._unfenced:
                stream.wait_event(event)
            self._unfenced.clear()
        if block:
            for slot in self.slots:
                if slot.pending_copy is not None:
                    with contextlib.suppress(Exception):  # reported by complete_pending
                        slot.pending_copy.result()

    def complete_pending(self) -> list[Slot]:
        """Slots whose copy has finished since the last call (never waits). A copy that failed
        leaves its slot uncommitted and is recorded in `copy_errors`."""
        done = []
        for slot in self.slots:
            if slot.pending_event is not None and slot.pending_event.query():
                slot.pending_event = None
                self._commit(slot, slot.step, slot.pending_header)
                done.append(slot)
            elif slot.pending_copy is not None and slot.pending_copy.done():
                error = slot.pending_copy.exception()
                slot.pending_copy = None
                if error is None:
                    done.append(slot)
                else:
                    slot.step = -1
                    slot.holders.clear()
                    self.copy_errors.append(f"{type(error).__name__}: {error}")
        return done

    def synchronize(self) -> None:
        """Wait for every copy started so far (`complete_pending` then reports them)."""
        for slot in self.slots:
            if slot.pending_event is not None:
                slot.pending_event.synchronize()
        self.fence(block=True)

    def _commit(self, slot: Slot, step: int, header: bytes) -> None:
        slot.files.commit(
            header=header, step=step, rank=self.rank, world_size=self.world_size, data_bytes=self.data_bytes
        )
        slot.step = step
