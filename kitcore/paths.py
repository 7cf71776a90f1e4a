"""The one validated path type of every path option and argument of every `nvrx-eks` command.

Each command declares what a path must be (a file it reads, a folder it reads, a folder it writes, a
file it writes) with `typer.Option(..., parser=...)`. click checks it while parsing, before the
command does any work, and reports a bad one as one message that names the option and the fix, exit
code 2: a folder where a file is read, a file where a folder is written, a read-only target, a name
longer than the file system allows. One type, so no command finds out on its own, deep inside, with a
traceback or a message that names the file but not the flag.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

# The Linux limits (linux/limits.h): a name of at most 255 bytes, a path of at most 4096.
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4096

Kind = Literal["read_file", "read_folder", "update_folder", "write_folder", "write_file", "update_file"]


def name_problem(path: Path) -> str | None:
    """Why the file system cannot hold `path` (a part or the whole too long), else None."""
    if len(os.fsencode(path)) >= PATH_MAX_BYTES:
        return f"is longer than the {PATH_MAX_BYTES - 1} bytes a path may have; use a shorter one"
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX_BYTES:
            return (
                f"has a name part of {len(os.fsencode(part))} bytes ({part[:24]}...); a file system name "
                f"holds at most {NAME_MAX_BYTES}: shorten it"
            )
    return None


def _nearest_existing(path: Path) -> Path:
    for folder in (path, *path.parents):
        if folder.exists():
            return folder
    return Path("/")


def _may_write(path: Path) -> bool:
    """Writable by this user, and not marked read-only: root may write anywhere, but a file or folder
    without a single write bit was made read-only by someone, and the kit does not overwrite it."""
    return os.access(path, os.W_OK) and bool(path.stat().st_mode & 0o222)


def _creatable(path: Path, what: str) -> str | None:
    """Why `path` (missing) cannot be created: its nearest existing ancestor is a file or read-only."""
    ancestor = _nearest_existing(path.absolute().parent)
    if not ancestor.is_dir():
        return f"is below {ancestor}, which is a file; pass a path in a folder for the {what}"
    if not _may_write(ancestor) or not os.access(ancestor, os.X_OK):
        return f"cannot be created: {ancestor} is read-only; pass a path you can write for the {what}"
    return None


def _file(path: Path, *, what: str, eg: str, write: bool) -> str | None:
    if not path.exists():
        return f"no such file; pass an existing {what}{eg}"
    if path.is_dir():
        return f"is a folder; pass a {what}{eg}"
    if not path.is_file():
        return f"is not a regular file; pass a {what}{eg}"
    if not os.access(path, os.R_OK):
        return f"is not readable by this user; fix its permissions or pass another {what}"
    if write and not _may_write(path):
        return f"is read-only; make it writable (chmod u+w) or pass another {what}"
    return None


def _folder(path: Path, *, what: str, eg: str, write: bool) -> str | None:
    if not path.exists():
        return f"no such folder; pass an existing {what}{eg}"
    if not path.is_dir():
        return f"is a file; pass a {what}{eg}"
    if not os.access(path, os.R_OK | os.X_OK):
        return f"is not readable by this user; fix its permissions or pass another {what}"
    if write and not _may_write(path):
        return f"is read-only; make it writable (chmod u+w) or pass another {what}"
    return None


def _new_folder(path: Path, *, what: str, eg: str) -> str | None:
    if not path.exists():
        return _creatable(path, what)
    if not path.is_dir():
        return f"is a file; pass a folder for the {what} (it is created if missing){eg}"
    if not _may_write(path):
        return f"is read-only; make it writable (chmod u+w) or pass another folder for the {what}"
    return None


def _new_file(path: Path, *, what: str, eg: str) -> str | None:
    if not path.exists():
        return _creatable(path, what)
    if path.is_dir():
        return f"is a folder; pass a file path for the {what}{eg}"
    if not _may_write(path):
        return f"is read-only; make it writable (chmod u+w) or pass another path for the {what}"
    return None


def path_problem(path: Path, kind: Kind, *, what: str, example: str = "") -> str | None:
    """Why `path` cannot serve as `kind` (the message names the fix), else None."""
    eg = f" (e.g. {example})" if example else ""
    problem = name_problem(path)
    if problem:
        return problem
    if kind in {"read_file", "update_file"}:
        return _file(path, what=what, eg=eg, write=kind == "update_file")
    if kind in {"read_folder", "update_folder"}:
        return _folder(path, what=what, eg=eg, write=kind == "update_folder")
    if kind == "write_folder":
        return _new_folder(path, what=what, eg=eg)
    return _new_file(path, what=what, eg=eg)


class PathType:
    """A typer `parser`: the value as a `Path`, refused while parsing when `path_problem` finds one.

    click adds the option's name to the message of the BadParameter raised here ("Invalid value for
    '--config' / '-c': ...") and exits 2 before the command runs."""

    def __init__(self, kind: Kind, *, what: str, example: str = "") -> None:
        self.kind = kind
        self.what = what
        self.example = example
        # typer names the parameter type (its metavar) after the parser.
        self.__name__ = "folder" if kind.endswith("folder") else "file"

    def __call__(self, value: str | Path) -> Path:
        path = value if isinstance(value, Path) else Path(value)
        problem = path_problem(path, self.kind, what=self.what, example=self.example)
        if problem:
            import typer  # noqa: PLC0415 - the trainer uses path_problem without the CLI's libraries

            raise typer.BadParameter(f"{path}: {problem}")
        return path


def read_file(what: str, example: str = "") -> PathType:
    """A file the command reads (exists, a regular file, readable)."""
    return PathType("read_file", what=what, example=example)


def read_folder(what: str, example: str = "") -> PathType:
    """A folder the command reads (exists, a folder)."""
    return PathType("read_folder", what=what, example=example)


def update_folder(what: str, example: str = "") -> PathType:
    """An existing folder the command reads and writes into (a report beside the run's files)."""
    return PathType("update_folder", what=what, example=example)


def write_folder(what: str, example: str = "") -> PathType:
    """A folder the command writes into (a folder or creatable, writable)."""
    return PathType("write_folder", what=what, example=example)


def write_file(what: str, example: str = "") -> PathType:
    """A file the command creates or replaces (not a folder, writable or creatable)."""
    return PathType("write_file", what=what, example=example)


def update_file(what: str, example: str = "") -> PathType:
    """An existing file the command rewrites in place (a regular file, readable and writable)."""
    return PathType("update_file", what=what, example=example)
