"""A prompt's K/V blocks moved from a prefill worker's cache to a decode worker's (disaggregated
serving, sut/engine/disaggregated.py), point to point on torch.distributed (gloo on CPU, NCCL on
GPU), so the same code runs across nodes under torchrun.

What moves: the blocks that hold the prompt's tokens, all layers, K and V, in the cache's own layout
(`[2, layers, blocks, block_size, kv_heads, head_dim]`; both sides run the same resolved settings,
so the layouts agree), gathered into one contiguous tensor on the prefill side, which then frees its
blocks: the buffer, not the cache, waits for the decode side (DistServe's prefill memory as the
queue). The decode side receives into a buffer of its own and copies it into blocks it allocates
only when it admits the request, so a receive never writes into blocks that may be freed meanwhile.

Each transfer carries a tag the router gives it, and both sides post their sends and receives in
the router's order, so they pair up whether or not the backend matches tags (NCCL does not). Both
calls return at once (isend / irecv); a thread per side waits for them in order and records when
each completed: the sender goes on with the next prefill meanwhile.
"""

import queue
import threading
import time

import torch
import torch.distributed as dist


class _Waiter:
    """Waits, on a thread of its own, for posted transfers in the order they were posted; `done()`
    returns what completed since the last call, with the seconds each took from its post."""

    def __init__(self, device: torch.device):
        self.device = device
        self._posted: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()
        threading.Thread(target=self._wait_in_order, daemon=True, name="saaf-kv-transfer").start()

    def post(self, work, item, posted_at: float) -> None:
        self._posted.put((work, item, posted_at))

    def _wait_in_order(self) -> None:
        while True:
            work, item, posted_at = self._posted.get()
            try:
                work.wait()
                if self.device.type == "cuda":  # NCCL's wait orders streams; the host time needs the device's
                    torch.cuda.current_stream(self.device).synchronize()
                error = None
            except Exception as e:  # noqa: BLE001 - a peer that died: the parent ends the run
                error = repr(e)
            self._done.put((item, time.perf_counter() - posted_at, error))

    def done(self) -> list[tuple[object, float, str | None]]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out


class TransferStats:
    """Transfers, bytes and seconds on one side; `summary()` for the run's record."""

    def __init__(self):
        self.count, self.bytes, self.seconds = 0, 0, []

    def record(self, nbytes: int, seconds: float) -> None:
        self.count += 1
        self.bytes += nbytes
        self.seconds.append(seconds)

    def summary(self) -> dict:
        total = sum(self.seconds)
        ordered = sorted(self.seconds)
        return {
            "transfers": self.count,
            "bytes": self.bytes,
            "seconds": total,
            "mb_per_s": self.bytes / total / 1e6 if total else None,
            "p50_ms": 1e3 * ordered[len(ordered) // 2] if ordered else None,
            "p99_ms": 1e3 * ordered[int(0.99 * len(ordered))] if ordered else None,
        }


class KVSender:
    """The prefill side: `send` copies blocks out of `kv_cache` and posts them to a decode rank."""

    def __init__(self, kv_cache: torch.Tensor):
        self.kv_cache = kv_cache
        self.stats = TransferStats()
        self._waiter = _Waiter(kv_cache.device)
        self._in_flight = 0

    def send(self, block_ids: list[int], dst: int, tag: int) -> None:
        index = torch.tensor(block_ids, dtype=torch.long, device=self.kv_cache.device)
        buffer = self.kv_cache.index_select(2, index)  # contiguous: its own memory, the blocks can go
        self._waiter.post(dist.isend(buffer, dst, tag=tag), buffer, time.perf_counter())
        self._in_flight += 1

    def poll(self) -> str | None:
        """Record the sends that completed (their buffers go with them); the first error, if any."""
        error = None
        for buffer, seconds, failed in self._waiter.done():
            self._in_flight -= 1
            self.stats.record(buffer.numel() * buffer.element_size(), seconds)
            error = error or failed
        return error

    @property
    def in_flight(self) -> int:
        return self._in_flight


class KVReceiver:
    """The decode side: `post` a receive of a request's blocks from a prefill rank; `arrived()` the
    keys and buffers of those complete; `scatter` a buffer into the blocks allocated for it."""

    def __init__(self, kv_cache: torch.Tensor):
        self.kv_cache = kv_cache
        self.stats = TransferStats()
        self._waiter = _Waiter(kv_cache.device)
        self._in_flight = 0

    def post(self, key, num_blocks: int, src: int, tag: int) -> None:
        shape = (*self.kv_cache.shape[:2], num_blocks, *self.kv_cache.shape[3:])
        buffer = torch.empty(shape, dtype=self.kv_cache.dtype, device=self.kv_cache.device)
        self._waiter.post(dist.irecv(buffer, src, tag=tag), (key, buffer), time.perf_counter())
        self._in_flight += 1

    def arrived(self) -> list[tuple[object, torch.Tensor, str | None]]:
        """(key, buffer, error) of each receive that completed since the last call, in posting order."""
        out = []
        for (key, buffer), seconds, error in self._waiter.done():
            self._in_flight -= 1
            if error is None:
                self.stats.record(buffer.numel() * buffer.element_size(), seconds)
            out.append((key, buffer, error))
        return out

    def scatter(self, buffer: torch.Tensor, block_ids: list[int]) -> None:
        index = torch.tensor(block_ids, dtype=torch.long, device=self.kv_cache.device)
        self.kv_cache.index_copy_(2, index, buffer[:, :, : len(block_ids)])

    @property
    def in_flight(self) -> int:
        return self._in_flight
