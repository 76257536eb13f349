"""Disaggregated prefill and decode (DistServe, Splitwise): `disaggregation={"prefill": P,
"decode": D}` runs P prefill workers and D decode workers, each a whole engine in its own process on
its own GPU or cores, behind the engine-client interface, so LoadGen, `LLM` and the report drive
them as they drive one engine.

A request's life: the pool sends it to the prefill worker with the fewest prompt tokens queued,
naming the decode worker with the most free KV blocks (less what is already on its way there). The
prefill worker computes the prompt (chunked, as any engine) and samples the first token, which goes
to the client at once; then it copies the prompt's K/V blocks out and sends them to the decode
worker (sut/engine/kv_transfer.py) and hands the request over through the pool: its first token
and, for a seeded request, its generator's state, so the decode worker samples on as one engine
would. The decode worker receives the blocks, admits the request when it has blocks and a running
slot for it, and continues it with continuous batching (and speculation, where set). The first
token is the prefill side's, so the transfer is paid before the second token, not the first.

A request that ends with its first token (a stop token, max_tokens 1, an error) is answered by the
prefill worker. A dead worker makes the next `step` raise WorkerError naming it; `fail_all` then
answers every request in flight, on either side or in transfer, once.

The workers form one torch.distributed group for the transfers (prefill workers ranks 0..P-1,
decode workers P..P+D-1); the pool's messages go over multiprocessing queues, as a replica pool's.
"""

import signal
import time

import torch
import torch.distributed as dist

from sut.config.resolved import ResolvedConfig
from sut.engine.kv_transfer import KVReceiver, KVSender, TransferStats
from sut.engine.llm_engine import LLMEngine
from sut.engine.replicas import ReplicaPool, ReplicaServer, pin
from sut.engine.resolve import for_role
from sut.errors import InvalidRequestError, WorkerError
from sut.outputs import RequestOutput
from sut.parallel import free_port, init_group
from sut.sequence import Sequence

TRANSFER_POLL_S = 0.002  # how often an idle decode worker looks for arrived blocks


class PrefillServer(ReplicaServer):
    """A prefill worker: each request runs to its first token (max_tokens 1 in this engine); then,
    if it goes on, its prompt's blocks go to its decode worker and the pool gets a handoff."""

    def __init__(self, index, engine, inbox, outbox):
        super().__init__(index, engine, inbox, outbox)
        self.sender = KVSender(engine.runner.kv_cache)
        self.going_on: dict[object, tuple[int, int]] = {}  # request id -> (decode rank, tag), for those that go on
        # This step's: (request id, first token, generator state, time.time(), decode rank, tag, blocks).
        self.handoffs: list[tuple] = []
        engine.set_kv_export(self.export)

    def describe(self) -> str:
        return f"prefill worker {self.index}"

    def handle(self, kind: str, args: list) -> None:
        if kind != "add":
            if kind == "abort":
                self.going_on.pop(args[0], None)
            return super().handle(kind, args)
        request_id, prompt, params, stream, decode_rank, tag = args
        try:
            seq = self.engine.make_sequence(prompt, params, request_id, self.on_token(request_id, stream))
        except InvalidRequestError as e:
            self.finished.append(RequestOutput(request_id, prompt, [], None, "error", str(e)))
            return
        if seq.max_tokens > 1:
            self.going_on[request_id] = (decode_rank, tag)
        seq.max_tokens = 1  # its first token here, the rest on the decode side
        self.engine.submit([seq])

    def export(self, seq: Sequence) -> None:
        """Scheduler.kv_export: `seq` got its first token and goes on; send its prompt's blocks."""
        route = self.going_on.pop(seq.request_id, None)
        if route is None:  # a warm-up request, or one that ends here
            return
        decode_rank, tag = route
        num_blocks = -(-len(seq.prompt_token_ids) // self.engine.config.block_size)
        self.sender.send(seq.block_table[:num_blocks], decode_rank, tag)
        state = seq.generator.get_state() if seq.generator is not None else None
        self.handoffs.append(
            (seq.request_id, seq.output_token_ids[0], state, time.time(), decode_rank, tag, num_blocks)
        )

    def poll(self) -> None:
        if (error := self.sender.poll()) is not None:
            raise WorkerError(f"{self.describe()}: a KV transfer failed: {error}")

    def fail(self, error: str) -> list[RequestOutput]:
        self.going_on.clear()
        return super().fail(error)

    def extra(self) -> dict | None:
        handed = {h[0] for h in self.handoffs}
        if handed:  # their outputs so far are the pool's to keep: they go on at a decode worker
            self.finished = [out for out in self.finished if out.request_id not in handed]
        for out in self.finished:  # ended here (an error, an abort): nothing to send for them
            self.going_on.pop(out.request_id, None)
        if not self.handoffs:
            return None
        extra, self.handoffs = {"handoffs": self.handoffs}, []
        return extra

    def reset(self) -> None:
        self.engine.reset()
        self.sender.stats = TransferStats()

    def transfer_stats(self) -> dict:
        deadline = time.monotonic() + 5.0  # sends whose receives completed are being recorded: let them
        while self.sender.in_flight and time.monotonic() < deadline:
            time.sleep(0.001)
            self.poll()
        return {"sent": self.sender.stats.summary(), "in_flight": self.sender.in_flight}


class _Incoming:
    """A request whose blocks a decode worker receives or holds, before it admits it."""

    __slots__ = ("seq", "first_token_time", "fate", "arrived")

    def __init__(self, seq: Sequence | None, first_token_time: float, fate: str | None):
        self.seq, self.first_token_time = seq, first_token_time
        self.fate = fate  # None: admit it; "abort": answer it aborted; "drop": answered already
        self.arrived: torch.Tensor | None = None  # the received blocks


class DecodeServer(ReplicaServer):
    """A decode worker: receives the blocks of the requests handed to it, admits each (in the order
    handed) when it has the blocks and a running slot for it, and decodes them."""

    def __init__(self, index, engine, inbox, outbox):
        super().__init__(index, engine, inbox, outbox)
        self.receiver = KVReceiver(engine.runner.kv_cache)
        self.incoming: dict[object, _Incoming] = {}  # in the order handed
        self.admitted: list = []  # this step's, for the pool's routing
        self.free_blocks_said = engine.block_manager.num_free_blocks  # as the pool last heard it
        self.handoff_ms: list[float] = []  # from the first token on the prefill side to admission here

    def describe(self) -> str:
        return f"decode worker {self.index}"

    def busy(self) -> bool:
        # Receives still posted are polled every TRANSFER_POLL_S meanwhile (wait_s), not spun on.
        return self.engine.has_unfinished() or any(i.arrived is not None for i in self.incoming.values())

    def wait_s(self) -> float:
        return TRANSFER_POLL_S if self.incoming else super().wait_s()

    def handle(self, kind: str, args: list) -> None:
        if kind == "receive":
            request_id, prompt, params, stream, first_token, state, src, tag, num_blocks, fate, first_token_time = args
            seq = None
            if fate != "drop":
                seq = self.engine.make_sequence(prompt, params, request_id, self.on_token(request_id, stream))
                seq.output_token_ids.append(first_token)
                if state is not None:
                    seq.generator.set_state(state)
            key = request_id if fate != "drop" else ("dropped", src, tag)
            self.receiver.post(key, num_blocks, src, tag)  # always: the sender's buffer waits for it
            self.incoming[key] = _Incoming(seq, first_token_time, fate)
        elif kind == "abort" and args[0] in self.incoming:
            self.incoming[args[0]].fate = "abort"
        else:
            super().handle(kind, args)

    def poll(self) -> None:
        for request_id, buffer, error in self.receiver.arrived():
            if error is not None:
                raise WorkerError(f"{self.describe()}: receiving request {request_id!r}'s KV blocks failed: {error}")
            self.incoming[request_id].arrived = buffer
        self._admit()

    def _admit(self) -> None:
        """Admit arrived requests in the order handed, while blocks and running slots allow."""
        engine, now = self.engine, time.time()
        for request_id, item in list(self.incoming.items()):
            if item.arrived is None:
                return
            seq = item.seq
            if item.fate is not None:
                del self.incoming[request_id]
                if item.fate == "abort":
                    self.finished.append(RequestOutput(request_id, seq.prompt_token_ids, [], None, "abort"))
                continue
            if len(engine.scheduler.running) >= engine.config.max_num_seqs:
                return
            prompt_tokens = len(seq.prompt_token_ids)
            if not engine.block_manager.allocate(seq, prompt_tokens):
                return
            self.receiver.scatter(item.arrived, seq.block_table)
            seq.num_computed_tokens = prompt_tokens
            seq.first_token_time = time.perf_counter()  # this engine's clock, for its TPOT guard
            del self.incoming[request_id]
            engine.add_prefilled(seq)
            self.admitted.append(request_id)
            self.handoff_ms.append(1e3 * (now - item.first_token_time))

    def fail(self, error: str) -> list[RequestOutput]:
        """The engine's requests, and those arrived but not admitted (a receive still posted keeps
        its entry: its buffer is written until it completes)."""
        failed = super().fail(error)
        for request_id, item in list(self.incoming.items()):
            if item.fate != "drop":
                failed.append(RequestOutput(request_id, item.seq.prompt_token_ids, [], None, "error", error))
            if item.arrived is not None:
                del self.incoming[request_id]
            else:
                item.fate = "drop"  # answered: dropped once received
        return failed

    def extra(self) -> dict | None:
        free = self.engine.block_manager.num_free_blocks
        if not self.admitted and free == self.free_blocks_said:
            return None
        extra, self.admitted, self.free_blocks_said = {"free_blocks": free, "admitted": self.admitted}, [], free
        return extra

    def reset(self) -> None:
        self.engine.reset()
        self.receiver.stats = TransferStats()
        self.handoff_ms = []

    def transfer_stats(self) -> dict:
        ordered = sorted(self.handoff_ms)
        return {
            "received": self.receiver.stats.summary(),
            "handoff_p50_ms": ordered[len(ordered) // 2] if ordered else None,
            "handoff_p99_ms": ordered[int(0.99 * len(ordered))] if ordered else None,
        }


def _worker_main(
    index: int,
    role: str,
    world: int,
    port: int,
    resolved: ResolvedConfig,
    verify: bool,
    cores: list[int] | None,
    inbox,
    outbox,
) -> None:
    """A prefill or decode worker's process: build the engine, join the transfers' group, serve.
    `verify`: sample as a speculating engine does (the decode side speculates)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what Ctrl-C means
    pin(cores)
    try:
        engine = LLMEngine.from_resolved(resolved)
        engine.verify_drafts = verify
        init_group(index, world, port, engine.device)  # after the engine: a worker that cannot load says why
    except Exception as e:  # noqa: BLE001 - reported to the parent, which names the worker
        outbox.put(("failed", index, f"{type(e).__name__}: {e}"))
        return
    server = (PrefillServer if role == "prefill" else DecodeServer)(index, engine, inbox, outbox)
    outbox.put(("ready", index, engine.max_model_len, engine.block_manager.num_blocks))
    server.run()
    dist.destroy_process_group()


class DisaggregatedPool(ReplicaPool):
    """P prefill and D decode workers behind the online engine's interface."""

    def _start(self, resolved: ResolvedConfig) -> None:
        split = resolved.engine.disaggregation
        self.num_prefill, self.num_decode = split.prefill, split.decode
        roles = ["prefill"] * split.prefill + ["decode"] * split.decode
        port = free_port()
        configs = {role: for_role(resolved, role) for role in ("prefill", "decode")}
        verify = resolved.engine.speculative_config is not None
        self._launch(
            resolved,
            _worker_main,
            lambda i, cores: (i, roles[i], len(roles), port, configs[roles[i]], verify, cores),
            [f"prefill worker {i}" for i in range(split.prefill)] + [f"decode worker {i}" for i in range(split.decode)],
        )
        self._prefill_tokens = [0] * self.num_prefill  # prompt tokens queued at each prefill worker
        self._free_blocks = self.num_blocks[self.num_prefill :]  # each decode worker's, as it last said
        self._claimed = [0] * self.num_decode  # blocks of requests on their way to each decode worker
        self._claims: dict[object, tuple[int, int]] = {}  # request id -> (its decode worker, blocks), until admitted
        self._tags = iter(range(2**62))
        self._aborted: set = set()  # asked to abort before their handoff reached their decode worker
        self.streamed_by_role = {"prefill": 0, "decode": 0}  # tokens streamed to on_token, by where they were sampled

    def _unclaim(self, request_id) -> None:
        """A request's blocks are no longer on their way: admitted, or ended before."""
        claim = self._claims.pop(request_id, None)
        if claim is not None:
            self._claimed[claim[0]] -= claim[1]

    def submit(self, seqs: list[Sequence]) -> None:
        with self._lock:
            if self._failed:
                raise WorkerError(f"the engine's workers stopped: {self._failed}")
            for seq in seqs:
                if seq.request_id in self._live:
                    raise InvalidRequestError(f"request id {seq.request_id!r} is already in use")
            for seq in seqs:
                p = min(range(self.num_prefill), key=self._prefill_tokens.__getitem__)
                d = max(range(self.num_decode), key=lambda i: self._free_blocks[i] - self._claimed[i])
                self._prefill_tokens[p] += len(seq.prompt_token_ids)
                self._claims[seq.request_id] = (d, -(-len(seq.prompt_token_ids) // self.config.block_size) + 1)
                self._claimed[d] += self._claims[seq.request_id][1]
                # Where the request is now (its prefill worker, then its decode worker's index in the
                # pool), its decode worker, its on_token, its sequence.
                self._live[seq.request_id] = (p, d, seq.on_token, seq)
                stream = seq.on_token is not None
                tag = next(self._tags) % 2**31  # names the transfer (gloo matches it; NCCL goes by order)
                self._inboxes[p].put(
                    ("add", seq.request_id, seq.prompt_token_ids, seq.params, stream, self.num_prefill + d, tag)
                )

    def abort(self, request_id) -> None:
        with self._lock:
            entry = self._live.get(request_id)
            if entry is not None:
                self._aborted.add(request_id)
                self._inboxes[entry[0]].put(("abort", request_id))

    def _handle(self, message: tuple) -> list[RequestOutput]:
        kind, index, *payload = message
        if kind != "step":
            return super()._handle(message)
        streamed, finished, extra = payload
        role = "prefill" if index < self.num_prefill else "decode"
        for request_id, token in streamed:
            entry = self._live.get(request_id)
            if entry is not None and entry[2] is not None:
                entry[2](token)
                self.streamed_by_role[role] += 1
        done = []
        with self._lock:
            if index < self.num_prefill:
                for handoff in (extra or {}).get("handoffs", []):
                    self._hand_over(index, *handoff)
            elif extra is not None:
                d = index - self.num_prefill
                self._free_blocks[d] = extra["free_blocks"]
                for request_id in extra["admitted"]:
                    self._unclaim(request_id)
            for out in finished:
                entry = self._live.pop(out.request_id, None)
                self._aborted.discard(out.request_id)
                self._unclaim(out.request_id)
                if entry is None:
                    continue
                if entry[0] < self.num_prefill:  # ended at its prefill worker
                    self._prefill_tokens[entry[0]] -= len(entry[3].prompt_token_ids)
                done.append(out)
        return done

    def _hand_over(self, p: int, request_id, token: int, state, first_token_time, rank: int, tag: int, blocks: int):
        """A request's first token is out and its blocks are on their way to decode rank `rank`:
        tell that worker (which receives them whatever became of the request meanwhile)."""
        entry = self._live.get(request_id)
        fate = "drop" if entry is None else "abort" if request_id in self._aborted else None
        prompt, params, stream = [], None, False
        if entry is not None:
            _, d, on_token, seq = entry
            self._prefill_tokens[p] -= len(seq.prompt_token_ids)
            self._live[request_id] = (rank, d, on_token, seq)  # now at its decode worker
            prompt, params, stream = seq.prompt_token_ids, seq.params, on_token is not None
        self._inboxes[rank].put(
            ("receive", request_id, prompt, params, stream, token, state, p, tag, blocks, fate, first_token_time)
        )

    def fail_all(self, error: str) -> list[RequestOutput]:
        with self._lock:
            self._prefill_tokens = [0] * self.num_prefill
            self._claimed = [0] * self.num_decode
            self._claims.clear()
            self._aborted.clear()
        return super().fail_all(error)

    @property
    def _speculating(self) -> range:
        """Only the decode workers speculate (ReplicaPool.spec_stats sums theirs)."""
        return self._decode_workers

    @property
    def _decode_workers(self) -> range:
        return range(self.num_prefill, self.num_replicas)

    def kv_cache_stats(self) -> dict:
        return {
            "prefill": self._call_all("kv_cache_stats", range(self.num_prefill)),
            "decode": self._call_all("kv_cache_stats", self._decode_workers),
        }

    def transfer_stats(self) -> dict:
        """The KV transfers: what each prefill worker sent, and each decode worker received (bytes,
        seconds from post to completion, MB/s) with the handoff's time from the first token to
        admission (the gap the transfer puts before the second token)."""
        return {
            "prefill": self._call_all("transfer_stats", range(self.num_prefill)),
            "decode": self._call_all("transfer_stats", self._decode_workers),
        }
