"""Worker processes (tensor-parallel ranks, data-parallel replicas, a benchmark's ranks): started
from a fresh interpreter ("spawn": no forked CUDA or thread state), watched, and ended, none left
behind.

A spawned process first re-imports the parent's main script, before it runs any code of ours; a
script that starts the engine outside an `if __name__ == "__main__":` guard fails there in every
worker. Each worker therefore marks, first thing in its own code, that it got there, so that one
that died before is told apart at once and its message names the guard, instead of the parent
waiting for it to join a collective (torch's store waits a minute and blames a timeout).
"""

import multiprocessing as mp
import os
import time
from collections.abc import Callable
from contextlib import contextmanager

from sut.errors import WorkerError

GUARD_HINT = (
    "before it reached its own code: a spawned worker first re-imports the main script, so a script "
    'that starts the engine must do so under `if __name__ == "__main__":` (the worker\'s own error is '
    "printed above)"
)


def _enter(target: Callable, reached, index: int, *args) -> None:
    reached[index] = 1
    target(*args)


@contextmanager
def _environment(values: dict):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class WorkerGroup:
    """`len(args)` processes running `target(*args[i])`, named `names[i]` (and `where[i]`) in errors,
    each started with the environment `envs[i]` laid over this one's (a spawned process inherits the
    environment at its start). Not `daemon`: a worker that starts processes of its own."""

    def __init__(
        self,
        target: Callable,
        args: list[tuple],
        names: list[str],
        envs: list[dict] | None = None,
        daemon: bool = True,
        where: list[str] | None = None,
    ):
        ctx = mp.get_context("spawn")
        self.names, self.args = names, args  # each worker's arguments, until it is stopped
        self.where = where or [""] * len(args)  # each worker's devices or cores, for its description
        self._reached = ctx.Array("b", len(args), lock=False)  # written once by each worker
        self.procs = [
            ctx.Process(
                target=_enter,
                args=(target, self._reached, i, *a),
                name="saaf-" + names[i].replace(" ", "-"),
                daemon=daemon,
            )
            for i, a in enumerate(args)
        ]
        for proc, env in zip(self.procs, envs or [{}] * len(args)):
            with _environment(env):
                proc.start()

    def describe(self, i: int) -> str:
        return f"{self.names[i]} (pid {self.procs[i].pid}{', ' + self.where[i] if self.where[i] else ''})"

    def dead(self, grace_s: float = 0.0, failed_only: bool = False) -> str | None:
        """The first worker that has exited (`failed_only`: with an error), described, or None; waits
        up to `grace_s` for one to be reaped (a collective can fail a moment before its peer's exit
        shows)."""
        deadline = time.monotonic() + grace_s
        while True:
            for i, proc in enumerate(self.procs):
                if proc.exitcode is not None and not (failed_only and proc.exitcode == 0):
                    why = f"died (exit code {proc.exitcode})"
                    return f"{self.describe(i)} {why}" + ("" if self._reached[i] else f" {GUARD_HINT}")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def wait_started(self, timeout_s: float = 120.0) -> None:
        """Return once every worker runs its own code; WorkerError at once if one died first."""
        deadline = time.monotonic() + timeout_s
        while not all(self._reached):
            if (dead := self.dead()) is not None:
                raise WorkerError(dead)
            if time.monotonic() > deadline:
                late = [self.describe(i) for i in range(len(self.procs)) if not self._reached[i]]
                raise WorkerError(f"{', '.join(late)} did not start within {timeout_s:.0f} s")
            time.sleep(0.01)

    def stop(self, ask: Callable[[list[int]], None] | None = None, timeout_s: float = 10.0) -> None:
        """`ask(alive)` the workers still alive (their indices) to stop, wait up to `timeout_s` for
        each, and kill the ones that do not stop."""
        if ask is not None:
            try:
                ask([i for i, proc in enumerate(self.procs) if proc.is_alive()])
            except RuntimeError:
                pass  # a worker went meanwhile: the kill below ends the rest
        for proc in self.procs:
            proc.join(timeout=timeout_s)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.args = []  # let go of what the workers were given: a queue's semaphores last until it is freed
