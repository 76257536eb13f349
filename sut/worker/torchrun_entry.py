"""Tensor parallelism with ranks torchrun starts, on one node or across several:

    torchrun [torchrun's options] -m sut.worker.torchrun_entry PROGRAM [ARGS...]

Every rank joins torchrun's process group (sut/parallel/torchrun.py: RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT from torchrun's environment). Rank 0 runs PROGRAM as `python -m PROGRAM
ARGS...` would (or as `python PROGRAM ARGS...` for a path ending in .py); an engine it starts with
tensor_parallel_size equal to WORLD_SIZE takes the other ranks as its own, which serve its steps
(sut/worker/tp_worker.py) and end when PROGRAM does. The model folder must be at the same path on
every node. For example, on one host with 2 CPU ranks (gloo):

    torchrun --nproc-per-node 2 -m sut.worker.torchrun_entry harness run --engine '{"tensor_parallel_size": 2}'

and on two nodes of 8 GPUs each, on node R (0 or 1), rank 0 on host A:

    torchrun --nnodes 2 --node-rank R --nproc-per-node 8 --master-addr A --master-port 29500 \\
        -m sut.worker.torchrun_entry harness run --system S --benchmark B --engine '{"tensor_parallel_size": 16}'
"""

import atexit
import os
import runpy
import signal
import sys
import traceback

from sut.errors import ConfigError
from sut.parallel import join_torchrun, leave_torchrun
from sut.worker.tp_worker import serve_torchrun


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if args else 2)
    try:
        group = join_torchrun()
    except ConfigError as e:
        sys.exit(f"error: sut.worker.torchrun_entry: {e}")
    try:
        try:
            if group.rank == 0:
                run_program(args)
            else:
                # Ctrl-C reaches every rank of a node: rank 0 decides what it means and ends the others.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                serve_torchrun(group)
        finally:
            leave_torchrun()
    except SystemExit as e:
        status = exit_status(e.code)
    except KeyboardInterrupt:
        status = 130
    except BaseException:
        traceback.print_exc()
        status = 1
    else:
        status = 0
    # Ended as multiprocessing ends its workers (the engine's own ranks): the exit handlers, then no
    # interpreter teardown. Modules torch imports lazily once the group exists (torch._dynamo, on a
    # model's first meta-device init) keep the group alive past destroy_process_group, and its
    # threads, destroyed still running in the C++ teardown, abort the process (SIGABRT) at random.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def exit_status(code) -> int:
    """The exit status of `sys.exit(code)`, as the interpreter makes it (a message printed)."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def run_program(args: list[str]) -> None:
    """PROGRAM ARGS... as `python -m PROGRAM ARGS...` (or `python PROGRAM ARGS...`) runs it."""
    program = args[0]
    sys.argv = list(args)
    if program.endswith(".py"):
        runpy.run_path(program, run_name="__main__")
    else:
        runpy.run_module(program, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
