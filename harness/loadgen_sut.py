"""LoadGen system-under-test adapters over the online engine.

LoadGen runs in a helper thread and the engine steps in the calling thread (`EngineSUT.run_test`):
torch's CPU ops run slower in a thread other than the main one (`python -m sut.bench.steps --thread`:
a decode step at batch 4 took 53 ms against 37 ms in the main thread). Offline puts every sample of LoadGen's one
query into the engine at once and completes each sample the moment it finishes. Server (and
Interactive, which is LoadGen's Server scenario with other limits) adds each query as it arrives,
reports the first token with FirstTokenComplete the moment it is sampled, then completes the
sample with all its tokens, beginning with that same first token. Responses are int32 token ids
with n_tokens. A request the engine fails still completes its sample, so LoadGen never waits.

Ctrl-C (SIGINT) during a test stops the engine loop after its step and raises Interrupted, with
LoadGen's thread still running: LoadGen has no call that ends a test early, and destroying its SUT
or QSL under a live test crashes the process, so `close` then leaves them, and the caller ends the
process (harness/run.py).
"""

import os
import signal
import threading

import mlperf_loadgen as lg
import numpy as np

from sut import EngineClient, SamplingParams, WorkerError


class Interrupted(Exception):
    """Ctrl-C during a LoadGen test: the engine loop stopped, LoadGen's thread did not."""


class EngineLoop:
    """Steps the engine while it has work, in the thread that calls `run`, until `stop`; calls
    `on_finish(output)` for each finished request. A dead replica (WorkerError) is fatal: what was
    in flight is answered with errors, then `on_fatal(error)` ends the run."""

    def __init__(self, engine: EngineClient, on_finish, on_fatal=None):
        self.engine = engine
        self.on_finish = on_finish
        self.on_fatal = on_fatal
        self._wake = threading.Event()
        self._stop = False

    def wake(self) -> None:
        self._wake.set()

    def run(self) -> None:
        while not self._stop:
            if not self.engine.has_unfinished():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            fatal = None
            try:
                outputs = self.engine.step()
            except WorkerError as e:
                fatal, outputs = e, self.engine.fail_all(str(e))
            except Exception as e:  # fail what is in flight, answer it, keep serving
                outputs = self.engine.fail_all(f"engine step failed: {e!r}")
            for out in outputs:
                self.on_finish(out)
            if fatal is not None and self.on_fatal is not None:
                self.on_fatal(fatal)

    def stop(self) -> None:
        self._stop = True
        self._wake.set()


def _complete(sample_id: int, tokens: list[int], first_token: bool = False) -> None:
    data = np.asarray(tokens, dtype=np.int32)
    ptr, size = data.ctypes.data, data.nbytes  # LoadGen copies the bytes during the call
    response = lg.QuerySampleResponse(sample_id, ptr, size, len(tokens))
    (lg.FirstTokenComplete if first_token else lg.QuerySamplesComplete)([response])


class EngineSUT:
    """One adapter for every scenario; `stream_first_token` is on for Server and Interactive."""

    def __init__(
        self,
        engine: EngineClient,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams],  # one for all, or one per QSL index
        stream_first_token: bool,
        on_complete=None,
        on_fatal=None,
    ):
        self.engine = engine
        self.on_complete = on_complete  # called with each finished output (a progress bar)
        self.prompts = prompts  # QSL index -> token ids
        self.params = params
        self.stream_first_token = stream_first_token
        self.errors: list[str] = []
        self.issued = 0  # samples LoadGen issued
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.loop = EngineLoop(engine, self._on_finish, on_fatal)
        self.handle = lg.ConstructSUT(self.issue_queries, self.flush_queries)

    def issue_queries(self, query_samples) -> None:
        with self._lock:
            self.issued += len(query_samples)
        for sample in query_samples:
            on_token = self._first_token_reporter(sample.id) if self.stream_first_token else None
            try:
                params = self.params[sample.index] if isinstance(self.params, list) else self.params
                self.engine.add_request(self.prompts[sample.index], params, request_id=sample.id, on_token=on_token)
            except Exception as e:  # refused up front: answer at once so LoadGen does not wait
                self._record_error(f"sample {sample.index}: {e}")
                _complete(sample.id, [])
        self.loop.wake()

    def _first_token_reporter(self, sample_id: int):
        sent = False

        def on_token(token: int) -> None:
            nonlocal sent
            if not sent:
                sent = True
                _complete(sample_id, [token], first_token=True)

        return on_token

    def _on_finish(self, out) -> None:
        if out.error is not None:
            self._record_error(f"request {out.request_id}: {out.error}")
        _complete(out.request_id, out.token_ids)
        if self.on_complete is not None:
            self.on_complete(out)

    def _record_error(self, message: str) -> None:
        with self._lock:
            self.errors.append(message)

    def flush_queries(self) -> None:
        pass

    def run_test(self, qsl, settings, log_settings, audit_config: str | None = None) -> None:
        """LoadGen's StartTestWithLogSettings in a helper thread while this thread steps the engine;
        returns when LoadGen does (it waits for every sample), re-raising what LoadGen raised.
        Ctrl-C raises Interrupted once the engine's step has ended; a second one exits at once."""
        raised: list[BaseException] = []
        interrupted = threading.Event()

        def on_sigint(signum, frame) -> None:
            if interrupted.is_set():
                os._exit(130)
            interrupted.set()
            self.loop.stop()

        def loadgen() -> None:
            try:
                args = (audit_config,) if audit_config is not None else ()
                lg.StartTestWithLogSettings(self.handle, qsl, settings, log_settings, *args)
            except BaseException as e:
                raised.append(e)
            finally:
                self.loop.stop()

        in_main = threading.current_thread() is threading.main_thread()  # where signal handlers can be set
        previous = signal.signal(signal.SIGINT, on_sigint) if in_main else None
        self._thread = threading.Thread(target=loadgen, name="loadgen", daemon=True)
        try:
            self._thread.start()
            self.loop.run()
        finally:
            if in_main:
                signal.signal(signal.SIGINT, previous)
        if interrupted.is_set():
            raise Interrupted(f"interrupted (Ctrl-C) after {self.issued} samples were issued")
        self._thread.join()
        if raised:
            raise raised[0]

    @property
    def loadgen_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        if not self.loadgen_running:  # under a live test, LoadGen's objects are left for the process's end
            lg.DestroySUT(self.handle)


def construct_qsl(num_samples: int, performance_count: int):
    """The samples live in memory already (tokenized up front, untimed): load and unload are no-ops."""
    return lg.ConstructQSL(num_samples, performance_count, lambda indices: None, lambda indices: None)
