"""A LoadGen run's folder, owned by the run that writes it, and trusted by a reader only when that
run finished.

The writer (`RunFolder`, used by `python -m harness run`) takes a lock beside the folder
(`.<name>.lock`, an flock the system drops when the process ends, however it ends), so a second run
aimed at the same folder is refused by name; then it clears the folder of an earlier run's files
(refusing a folder that holds anything else) and writes STATUS_FILE saying "running". A run that
ends well rewrites it last as "complete", with the SHA-256 of every file beside it; one that fails
or is interrupted writes "failed" and why; one that is killed leaves "running". Every reader (the
packager, the report) calls `complete_run`, which refuses a folder whose status is not
"complete" or whose files changed since, naming the folder and what happened to its run.

Also here, for every command that writes or deletes: `check_inside`, the check that a path lies
inside the build folder it belongs to, and `FolderLock`, the lock itself.
"""

import datetime
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

STATUS_FILE = "run_status.json"
# What a run writes: LoadGen's logs, and the harness's files beside them (harness/run.py). A folder
# holding anything else is not a run's, and is never cleared.
RUN_FILES = frozenset(
    {
        "mlperf_log_summary.txt",
        "mlperf_log_detail.txt",
        "mlperf_log_accuracy.json",
        "mlperf_log_trace.json",
        "accuracy.txt",
        "run.json",
        "speculative_decoding.json",
        "steps.json",
        "user.conf",
        "machine.txt",
        STATUS_FILE,
        f".{STATUS_FILE}.tmp",
    }
)


class RunFolderError(RuntimeError):
    """A run folder that cannot be written (in use, not a run's) or read (incomplete, changed)."""


def check_inside(path: Path, base: Path, what: str) -> Path:
    """`path`, resolved, after checking that it lies inside `base` (a command's own build folder): a
    name from a file or the command line must never lead a write or a delete elsewhere."""
    resolved, base = Path(path).resolve(), Path(base).resolve()
    if not resolved.is_relative_to(base):
        raise RunFolderError(f"{what} {path} lies outside {base}, the folder it must be in")
    return resolved


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class FolderLock:
    """An exclusive, non-blocking lock on `path` (a file created for it), held until `release` or the
    process's end. `acquire` raises RunFolderError naming `what` and the holder's pid when another
    process holds it."""

    def __init__(self, path: Path, what: str):
        self.path, self.what, self._fd = Path(path), what, None

    def acquire(self) -> "FolderLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunFolderError(
                f"{self.what} is in use by {holder}: wait for it to end, or use another folder"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} (since {_now()})\n".encode())
        self._fd = fd
        return self

    def held_elsewhere(self) -> bool:
        """Whether another process holds the lock now (without taking it)."""
        if not self.path.is_file():
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def lock_for(folder: Path) -> FolderLock:
    folder = Path(folder)
    return FolderLock(folder.parent / f".{folder.name}.lock", f"run folder {folder}")


class RunFolder:
    """The writer's side: `open` (before anything slow: the model load) takes the folder, `complete`
    or `fail` ends the run's claim on it."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.lock = lock_for(self.folder)
        self.replaced: str | None = None  # the status of the earlier run whose files `open` cleared

    def open(self, description: dict) -> None:
        """Refuse a path that is a file or a folder holding more than a run's files; take the lock;
        clear an earlier run's files; write the "running" status with `description` (what runs)."""
        folder = self.folder
        if folder.exists() and not folder.is_dir():
            raise RunFolderError(f"log folder {folder} is a file, not a folder: give another --log-dir")
        if folder.is_dir():
            foreign = sorted(p.name for p in folder.iterdir() if p.name not in RUN_FILES or not p.is_file())
            if foreign:
                raise RunFolderError(
                    f"log folder {folder} holds {', '.join(foreign[:3])}"
                    f"{' ...' if len(foreign) > 3 else ''}, which no run writes: it is not a run's "
                    "folder, and is left as it is (give --log-dir an empty or new folder)"
                )
        self.lock.acquire()
        if folder.is_dir():
            earlier = read_status(folder)
            if any(folder.iterdir()):
                self.replaced = (
                    f"{earlier.get('status', 'unknown')}, from {earlier.get('started', 'an unknown time')}"
                    if earlier
                    else "with no status"
                )
            for path in folder.iterdir():
                path.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        self._write({"status": "running", "pid": os.getpid(), "started": _now(), **description})

    def complete(self, verdict: str) -> None:
        """Mark the run complete: STATUS_FILE, written last, holds the hash of every other file."""
        files = {p.name: sha256_of(p) for p in sorted(self.folder.iterdir()) if p.name != STATUS_FILE}
        self._write(
            {**read_status(self.folder), "status": "complete", "finished": _now(), "verdict": verdict, "files": files}
        )
        self.lock.release()

    def fail(self, reason: str) -> None:
        """Mark the run failed, with why; its files stay for a look, and no reader takes them."""
        if self.folder.is_dir():
            self._write({**read_status(self.folder), "status": "failed", "finished": _now(), "reason": reason})
        self.lock.release()

    def _write(self, status: dict) -> None:
        tmp = self.folder / f".{STATUS_FILE}.tmp"
        tmp.write_text(json.dumps(status, indent=2) + "\n")
        os.replace(tmp, self.folder / STATUS_FILE)  # a reader sees the old status or the new, never half


def read_status(folder: Path) -> dict:
    """STATUS_FILE's contents; {} when there is none or it cannot be read."""
    try:
        status = json.loads((Path(folder) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def complete_run(folder: Path, needs: tuple[str, ...] = ()) -> dict:
    """The status of the complete run in `folder`, after checking that every file it hashed (and
    each of `needs`) is there unchanged; else RunFolderError saying what happened to the run."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RunFolderError(f"{folder}: no such run folder: run it first (`python -m harness run`)")
    status = read_status(folder)
    state = status.get("status")
    if state != "complete":
        if not status:
            why = f"it has no {STATUS_FILE}, so no run is known to have finished in it"
        elif state == "running" and lock_for(folder).held_elsewhere():
            why = f"its run (pid {status.get('pid')}, started {status.get('started')}) is still running"
        elif state == "running":
            why = (
                f"its run (pid {status.get('pid')}, started {status.get('started')}) never finished: it was "
                "killed or crashed"
            )
        else:
            why = f"its run failed: {status.get('reason', 'no reason recorded')}"
        raise RunFolderError(f"{folder} holds no complete run: {why}; run it again")
    files = status.get("files", {})
    missing = [name for name in needs if name not in files]
    if missing:
        raise RunFolderError(f"{folder}: its complete run wrote no {', '.join(missing)}")
    for name, digest in files.items():
        path = folder / name
        if not path.is_file():
            raise RunFolderError(f"{path}: missing since its run completed: run it again")
        if sha256_of(path) != digest:
            raise RunFolderError(
                f"{path}: changed since its run completed (its SHA-256 is not the one the run "
                f"recorded in {STATUS_FILE}): run it again"
            )
    return status


def clear_build_folder(folder: Path, build: Path) -> None:
    """Delete `folder`, which must lie inside `build` (a command's build folder)."""
    path = check_inside(folder, build, "folder to clear")
    if path == Path(build).resolve():
        raise RunFolderError(f"refusing to clear {build} itself")
    shutil.rmtree(path, ignore_errors=True)
