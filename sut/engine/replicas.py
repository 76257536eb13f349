"""Data parallelism: `data_parallel_size` engine replicas, each an LLMEngine in its own process
pinned to its own devices (CUDA_VISIBLE_DEVICES) or, on CPU, to a disjoint set of cores with as many
threads, behind one object with the online engine's interface (`add_request`, `step`, ...), so the
offline API and the LoadGen harness drive N replicas as they drive one engine.

A request goes to the replica with the least outstanding work (prompt plus max_tokens of what it
has in flight, a token count, as the prefill and decode it still owes). Each replica steps its
engine and, once a step, sends back what that step produced: the tokens of requests that stream
them and the requests that finished. A replica that dies (killed, out of memory, an exception)
makes the next `step` raise WorkerError naming it; every request still in flight then gets an
error output from `fail_all`, once, and the pool refuses new ones.
"""

import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

from sut.config import EngineConfig
from sut.config.resolved import ResolvedConfig
from sut.engine.llm_engine import LLMEngine
from sut.engine.processes import WorkerGroup
from sut.engine.profile import profile_steps
from sut.engine.requests import load_tokenizer, make_sequence
from sut.engine.resolve import for_replica, resolve
from sut.errors import InvalidRequestError, SaafError, WorkerError
from sut.outputs import RequestOutput
from sut.sampling_params import SamplingParams
from sut.sequence import Sequence
from sut.spec_decode.metrics import SpecMetrics

POLL_S = 0.05  # how long `step` waits for a replica's news before looking at the processes


def placements(n: int, device: str, gpus_each: int = 1) -> list[dict]:
    """Each replica's environment and cores: on CUDA `gpus_each` GPUs each (its tensor-parallel
    ranks'; the engine sees them from cuda:0 on), on CPU a contiguous, disjoint share of this
    process's cores (resolve has checked there are enough)."""
    if device.startswith("cuda"):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
        return [
            dict(env={"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * gpus_each : (i + 1) * gpus_each])}, cores=None)
            for i in range(n)
        ]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    share = len(cores) // n
    # OMP_NUM_THREADS for the C kernels' OpenMP, which sizes its pool when their library loads.
    return [dict(env={"OMP_NUM_THREADS": str(share)}, cores=cores[i * share : (i + 1) * share]) for i in range(n)]


IDLE_POLL_S = 1.0  # how long an idle replica waits for a message before checking that its parent lives


class ReplicaServer:
    """A replica process's loop: take the pool's messages, step the engine while it has work, and
    after each step send back what it produced: ("step", index, streamed tokens, finished outputs,
    `extra()`). Disaggregated serving's workers (sut/engine/disaggregated.py) add to it."""

    def __init__(self, index: int, engine: LLMEngine, inbox, outbox):
        self.index, self.engine, self.inbox, self.outbox = index, engine, inbox, outbox
        self.streamed: list[tuple[object, int]] = []  # (request id, token) of this step, for the parent's on_token
        self.finished: list[RequestOutput] = []  # answered outside a step (a refused request)

    def on_token(self, request_id, stream: bool):
        return (lambda token: self.streamed.append((request_id, token))) if stream else None

    def busy(self) -> bool:
        """Work to do without waiting for a message."""
        return self.engine.has_unfinished()

    def wait_s(self) -> float:
        return IDLE_POLL_S

    def run(self) -> None:
        """Until told to stop or the parent is gone."""
        parent = os.getppid()
        while True:
            messages = []
            while not messages and not self.busy():
                try:
                    messages.append(self.inbox.get(timeout=self.wait_s()))
                except queue.Empty:
                    if os.getppid() != parent:  # orphaned (the parent was killed): nobody to answer
                        return
                    self.poll()
            while True:
                try:
                    messages.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            for kind, *args in messages:
                if kind == "stop":
                    return
                self.handle(kind, args)
            self.poll()
            if self.engine.has_unfinished():
                try:
                    self.finished += self.engine.step()
                except Exception as e:  # noqa: BLE001 - fail what is in flight, answer it, keep serving
                    self.finished += self.fail(f"engine step failed in {self.describe()}: {e!r}")
            extra = self.extra()
            if self.finished or self.streamed or extra:
                self.outbox.put(("step", self.index, self.streamed, self.finished, extra))
                self.streamed, self.finished = [], []

    def describe(self) -> str:
        return f"data-parallel replica {self.index}"

    def handle(self, kind: str, args: list) -> None:
        if kind == "add":
            request_id, prompt, params, stream = args
            try:
                self.engine.add_request(prompt, params, request_id, self.on_token(request_id, stream))
            except SaafError as e:
                self.finished.append(RequestOutput(request_id, prompt, [], None, "error", str(e)))
        elif kind == "abort":
            self.engine.abort(args[0])
        elif kind == "call":  # a method the pool calls on every replica (warmup, the stats): its own or the engine's
            method = getattr(self, args[0], None) or getattr(self.engine, args[0])
            self.outbox.put(("reply", self.index, method(*args[1:])))

    def profile_steps(self, prompts: list[list[int]], budget_s: float) -> dict:
        return profile_steps(self.engine, prompts, budget_s)

    def poll(self) -> None:
        """Before each step, and while idle: what a worker attends to besides its engine."""

    def fail(self, error: str) -> list[RequestOutput]:
        return self.engine.fail_all(error)

    def extra(self) -> dict | None:
        """What else goes to the pool after a step; None: nothing."""
        return None


def _replica_main(index: int, resolved: ResolvedConfig, cores: list[int] | None, inbox, outbox) -> None:
    """A replica's process (its environment set at spawn): build the engine, then serve."""
    # Ctrl-C reaches the whole process group: the parent decides what it means and stops the replicas.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pin(cores)
    try:
        engine = LLMEngine.from_resolved(resolved)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which names the replica
        outbox.put(("failed", index, f"{type(e).__name__}: {e}"))
        return
    outbox.put(("ready", index, engine.max_model_len, engine.block_manager.num_blocks))
    ReplicaServer(index, engine, inbox, outbox).run()


def pin(cores: list[int] | None) -> None:
    """A CPU worker on its own cores, with as many threads."""
    if cores:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(len(cores))


class ReplicaPool:
    """N replicas of `LLMEngine(model, **settings)` (settings without data_parallel_size) with the
    online engine's interface."""

    def __init__(self, model: str | Path, data_parallel_size: int, **settings):
        config = EngineConfig.from_kwargs(**{**settings, "data_parallel_size": data_parallel_size})
        self._start(resolve(model, config))

    @classmethod
    def from_resolved(cls, resolved: ResolvedConfig) -> "ReplicaPool":
        """A pool of `resolved.engine.data_parallel_size` replicas from settings already resolved:
        every check, and the checksums, made once here rather than in every replica."""
        pool = cls.__new__(cls)
        pool._start(resolved)
        return pool

    def _start(self, resolved: ResolvedConfig) -> None:
        n = resolved.engine.data_parallel_size
        self._launch(
            resolved,
            _replica_main,
            lambda i, cores: (i, for_replica(resolved), cores),
            [f"data-parallel replica {i}" for i in range(n)],
        )

    def _launch(self, resolved: ResolvedConfig, target: Callable, args: Callable, names: list[str]) -> None:
        """Start `len(names)` workers, worker i running `target(*args(i, its cores), inbox, outbox)`
        on its own devices or cores, and wait until each has its engine ready."""
        n = len(names)
        self.config, self.model_config = resolved.engine, resolved.model
        self.tokenizer = load_tokenizer(resolved.folder)
        self.dtype, self.device = resolved.dtype, torch.device(resolved.device)
        self.num_replicas = n
        ctx = mp.get_context("spawn")
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(n)]
        self.placements = placements(n, resolved.device, self.config.tensor_parallel_size)
        # Not daemonic, so that a replica can start tensor-parallel ranks of its own; the finalizer
        # below stops them at exit, and each stops by itself when orphaned.
        self.workers = WorkerGroup(
            target,
            [(*args(i, p["cores"]), self._inboxes[i], self._outbox) for i, p in enumerate(self.placements)],
            names,
            envs=[p["env"] for p in self.placements],
            daemon=False,
            where=[
                f"cores {p['cores']}" if p["cores"] else f"GPU {p['env']['CUDA_VISIBLE_DEVICES']}"
                for p in self.placements
            ],
        )
        inboxes = self._inboxes  # the finalizer must not hold the pool

        def ask_to_stop(alive: list[int]) -> None:
            for i in alive:
                inboxes[i].put(("stop",))

        self._stop = weakref.finalize(self, self.workers.stop, ask_to_stop)
        self._lock = threading.Lock()
        self._live: dict[object, tuple[int, int, Callable | None, Sequence]] = {}  # id -> replica, cost, on_token, seq
        self._outstanding = [0] * n
        self._next_id = iter(range(2**62))
        self._failed: str | None = None
        self._checked_at = time.monotonic()  # when step() last looked for a dead worker
        self._replies: dict[str, dict[int, object]] = {"ready": {}, "reply": {}}  # kind -> replica -> reply
        try:
            ready = [self._wait_for("ready", i) for i in range(n)]  # (max_model_len, KV blocks) each
        except BaseException:
            self.close()
            raise
        self.max_model_len = ready[0][0]
        self.num_blocks = [blocks for _, blocks in ready]

    # ---- the replicas' news ----------------------------------------------------------------
    def _check_alive(self) -> None:
        if (dead := self.workers.dead()) is not None:
            self._failed = dead
            raise WorkerError(dead)

    def _receive(self, timeout: float) -> tuple | None:
        try:
            return self._outbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def _wait_for(self, kind: str, index: int):
        """Replica `index`'s next `kind` reply, handling the replicas' other news meanwhile."""
        while index not in self._replies[kind]:
            message = self._receive(POLL_S)
            if message is None:
                self._check_alive()
            else:
                self._handle(message)
        return self._replies[kind].pop(index)

    def _handle(self, message: tuple) -> list[RequestOutput]:
        kind, index, *payload = message
        if kind == "failed":
            self._failed = f"{self.workers.describe(index)} could not start: {payload[0]}"
            raise WorkerError(self._failed)
        if kind != "step":
            self._replies[kind][index] = payload[0] if len(payload) == 1 else payload
            return []
        streamed, finished, _ = payload
        for request_id, token in streamed:
            entry = self._live.get(request_id)
            if entry is not None and entry[2] is not None:
                entry[2](token)
        done = []
        with self._lock:
            for out in finished:
                entry = self._live.pop(out.request_id, None)
                if entry is not None:
                    self._outstanding[entry[0]] -= entry[1]
                    done.append(out)
        return done

    # ---- the online engine's interface -------------------------------------------------------
    def make_sequence(self, prompt, params=None, request_id=None, on_token=None) -> Sequence:
        if request_id is None:
            request_id = next(self._next_id)
        return make_sequence(
            prompt, params, request_id, on_token, self.tokenizer, self.model_config.vocab_size, self.max_model_len
        )

    def add_request(self, prompt, params: SamplingParams | None = None, request_id=None, on_token=None):
        seq = self.make_sequence(prompt, params, request_id, on_token)
        self.submit([seq])
        return seq.request_id

    def submit(self, seqs: list[Sequence]) -> None:
        with self._lock:
            if self._failed:
                raise WorkerError(f"the engine's replicas stopped: {self._failed}")
            for seq in seqs:
                if seq.request_id in self._live:
                    raise InvalidRequestError(f"request id {seq.request_id!r} is already in use")
            for seq in seqs:
                cost = len(seq.prompt_token_ids) + seq.max_tokens
                index = min(range(self.num_replicas), key=self._outstanding.__getitem__)
                self._outstanding[index] += cost
                self._live[seq.request_id] = (index, cost, seq.on_token, seq)
                self._inboxes[index].put(
                    ("add", seq.request_id, seq.prompt_token_ids, seq.params, seq.on_token is not None)
                )

    def abort(self, request_id) -> None:
        with self._lock:
            entry = self._live.get(request_id)
        if entry is not None:
            self._inboxes[entry[0]].put(("abort", request_id))

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._live)

    def step(self) -> list[RequestOutput]:
        """What the replicas finished since the last call (their streamed tokens go to each request's
        on_token first); waits up to POLL_S for news. WorkerError if a replica died."""
        message = self._receive(POLL_S)
        now = time.monotonic()
        if message is None or now - self._checked_at > POLL_S:  # the others' news must not hide a death
            self._checked_at = now
            self._check_alive()
        if message is None:
            return []
        done = self._handle(message)
        while (message := self._receive(0)) is not None:
            done += self._handle(message)
        return done

    def fail_all(self, error: str) -> list[RequestOutput]:
        """An error output for every request in flight, each once."""
        with self._lock:
            live, self._live = self._live, {}
            self._outstanding = [0] * self.num_replicas
        return [
            RequestOutput(rid, seq.prompt_token_ids, [], None, "error", error) for rid, (_, _, _, seq) in live.items()
        ]

    def _call_all(self, method: str, workers: range | None = None, args: tuple = ()) -> list:
        """Engine method `method` run with `args` on every replica (of `workers`) at once: their
        results in order."""
        workers = workers or range(self.num_replicas)
        for i in workers:
            self._inboxes[i].put(("call", method, *args))
        return [self._wait_for("reply", i) for i in workers]

    def profile_steps(self, prompts: list[list[int]], budget_s: float) -> list[dict]:
        """Every worker's steps profiled at once, each in its process on its cores (sut/engine/profile.py),
        in worker order."""
        return self._call_all("profile_steps", args=(prompts, budget_s))

    def warmup(self) -> float:
        """Every replica's warm-up, at once; the seconds of the slowest."""
        return max(self._call_all("warmup"))

    def reset(self) -> None:
        """Every replica's reset (LLMEngine.reset), at once."""
        self._call_all("reset")

    @property
    def _speculating(self) -> range:
        """The workers whose engines speculate, if any do: every replica."""
        return range(self.num_replicas)

    def spec_stats(self) -> dict | None:
        """Speculation's counts summed over the workers that speculate (rates from the sums); None
        without it."""
        per_replica = self._call_all("spec_stats", self._speculating)
        if per_replica[0] is None:
            return None
        total = SpecMetrics(per_replica[0]["num_speculative_tokens"])
        for spec in per_replica:
            total.num_proposals += spec["num_proposals"]
            total.num_draft_tokens += spec["num_draft_tokens"]
            total.num_accepted_tokens += spec["num_accepted_tokens"]
            total.proposed_at = [a + b for a, b in zip(total.proposed_at, spec["proposed_at_position"])]
            total.accepted_at = [a + b for a, b in zip(total.accepted_at, spec["accepted_at_position"])]
        return {**per_replica[0], **total.summary()}

    def kv_cache_stats(self) -> dict:
        """Each replica's (a list)."""
        return {"replicas": self._call_all("kv_cache_stats")}

    def busy_stats(self) -> dict:
        """Summed over the replicas (machine time: each replica holds its own devices)."""
        per_replica = self._call_all("busy_stats")
        return {key: sum(b[key] for b in per_replica) for key in per_replica[0]}

    def close(self) -> None:
        """Stop every replica and wait for it: none is left behind. Then let go of the queues, whose
        semaphores are freed with them (a process that ends in os._exit, as the harness on Ctrl-C,
        would otherwise leave them to the resource tracker, which warns of leaks)."""
        self._stop()
        if self._outbox is None:  # closed before
            return
        # A replica that ended on its own (exit 0) read its inbox up to "stop", the last message sent:
        # each feeder thread has written everything and ends once closed. One that was killed may have
        # left its inbox's feeder blocked on a full pipe: never wait for that.
        read_to_the_end = all(proc.exitcode == 0 for proc in self.workers.procs)
        for q in (self._outbox, *self._inboxes):
            if not read_to_the_end:
                q.cancel_join_thread()
            q.close()
            q.join_thread()
        self._outbox, self._inboxes = None, []
