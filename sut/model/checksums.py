"""A model folder's SHA256SUMS (the `sha256sum` format: `<hex digest>  <file name>` a line, as our
converter writes one), verified before its weights load: a file that changed since it was written
(a bad copy, a disk error, an edit) is named, rather than loaded into a model that answers wrongly.
A folder without SHA256SUMS is loaded as it is; the engine setting verify_checksums=false skips
the check (a large checkpoint its user has verified)."""

import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sut.errors import CheckpointError

SUMS_FILE = "SHA256SUMS"
_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)")  # sha256sum's text (" ") and binary ("*") modes


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)  # hashlib releases the GIL here: files hash in parallel in threads
    return digest.hexdigest()


def write_sums(folder: Path) -> None:
    """folder's SHA256SUMS, of every file in it and below but dotfiles (markers)."""
    names = sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name != SUMS_FILE and not p.name.startswith(".")
    )
    (folder / SUMS_FILE).write_text("".join(f"{sha256_of(folder / name)}  {name}\n" for name in names))


def read_sums(folder: Path) -> dict[str, str]:
    """{file name: expected digest} from folder's SHA256SUMS ({} without one)."""
    path = folder / SUMS_FILE
    if not path.is_file():
        return {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot be read ({e})") from e
    sums = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        match = _LINE.fullmatch(line)
        name = match and match.group(2)
        if not match or Path(name).is_absolute() or ".." in Path(name).parts:
            raise CheckpointError(f"{path}: line {number} is not '<sha256>  <file in the folder>': {line[:120]!r}")
        sums[name] = match.group(1).lower()
    return sums


def verify_folder(folder: Path) -> int:
    """Check every file folder's SHA256SUMS lists; returns the bytes hashed (0 without SHA256SUMS).
    CheckpointError naming the first file that is missing or differs."""
    sums = read_sums(folder)
    missing = [name for name in sums if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"{folder}: {SUMS_FILE} lists {missing[0]}, which is missing from the folder")
    names = sorted(sums, key=lambda name: -(folder / name).stat().st_size)  # the largest start first
    with ThreadPoolExecutor(max_workers=max(1, min(len(names), os.cpu_count() or 1))) as pool:
        found = dict(zip(names, pool.map(lambda name: sha256_of(folder / name), names)))
    for name in sorted(sums):
        if found[name] != sums[name]:
            raise CheckpointError(
                f"{folder / name}: its SHA-256 is {found[name]}, and {SUMS_FILE} says "
                f"{sums[name]}: the file changed since it was written (a bad copy or an "
                f"edit); restore it, or set the engine setting verify_checksums to false to "
                f"load it as it is"
            )
    return sum((folder / name).stat().st_size for name in names)
