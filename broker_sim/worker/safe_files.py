"""Files under an anchor directory, reached without following a symbolic link and within one budget.

A checkpoint and a file sink live on storage that others can write: a symbolic link planted at ``offsets/`` or
``_spark_metadata`` must not lead a reset to delete files elsewhere, a FIFO must not hang a reader, and forged
logs must not make one request read gigabytes. So every step below the anchor is opened relative to its
parent's descriptor with ``O_NOFOLLOW`` (a link is refused, not followed), only regular files are read (opened
``O_NONBLOCK``, then checked with ``fstat``), and each request carries one :class:`Budget` of bytes read,
entries listed and time, charged by every operation, so the bound holds in total, not per file."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
from collections.abc import Iterator

from controller.protocol.tasks.checkpoints import CheckpointError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

#: bytes one request may read in total (every log it parses together)
MAX_REQUEST_BYTES = 64 * 1024 * 1024
#: directory entries one request may list or visit in total
MAX_REQUEST_ENTRIES = 400_000
#: seconds one request may spend on the file system
MAX_REQUEST_S = 30.0


class BudgetExceeded(CheckpointError):
    """A request reached its bound of bytes, entries or time: what it read so far is not the whole."""


class Budget:
    """One request's allowance, charged by every read and listing (not thread-safe: one per request)."""

    def __init__(
        self, max_bytes: int = MAX_REQUEST_BYTES, max_entries: int = MAX_REQUEST_ENTRIES, seconds: float = MAX_REQUEST_S
    ) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.bytes = 0
        self.entries = 0

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise BudgetExceeded(f"the request ran out of its {self.seconds:g}s on the file system")

    def charge_bytes(self, n: int) -> None:
        self.bytes += n
        if self.bytes > self.max_bytes:
            raise BudgetExceeded(f"the request would read over {self.max_bytes:,} bytes in total")
        self.check_time()

    def charge_entries(self, n: int) -> None:
        self.entries += n
        if self.entries > self.max_entries:
            raise BudgetExceeded(f"the request would list over {self.max_entries:,} entries in total")
        self.check_time()

    def room(self) -> int:
        """Bytes still allowed."""
        return max(0, self.max_bytes - self.bytes)


def _refusal(path: str, exc: OSError) -> CheckpointError:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return CheckpointError(f"{path} is a symbolic link: refused (it is not followed out of its directory)")
    if exc.errno == errno.ENOTDIR:
        return CheckpointError(f"{path} is not a directory (a symbolic link or a file where one was expected)")
    return CheckpointError(f"{path}: {exc.strerror or exc}")


class SafeDir:
    """A directory held by its descriptor; everything below it is reached one component at a time."""

    def __init__(self, fd: int, path: str, budget: Budget) -> None:
        self.fd = fd
        self.path = path
        self.budget = budget

    # ---- opening ------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str, budget: Budget, create: bool = False) -> SafeDir | None:
        """The anchor itself: its own path is the operator's (resolved as given), but it must not be a
        symbolic link nor anything other than a directory. None where it does not exist (and not ``create``)."""
        if create:
            os.makedirs(path, exist_ok=True)
        try:
            fd = os.open(path, _DIR_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _refusal(path, exc) from None
        return cls(fd, path, budget)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> SafeDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _child(self, name: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            raise CheckpointError(f"{self.path}: {name!r} is not one path component")
        return f"{self.path.rstrip('/')}/{name}"

    def sub(self, name: str, create: bool = False) -> SafeDir | None:
        """A child directory (None where missing, unless ``create``); a link or a file there is refused."""
        where = self._child(name)
        self.budget.check_time()
        if create:
            try:
                os.mkdir(name, 0o755, dir_fd=self.fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise _refusal(where, exc) from None
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _refusal(where, exc) from None
        return SafeDir(fd, where, self.budget)

    def walk_to(self, rel: str, create: bool = False) -> SafeDir | None:
        """The directory ``rel`` (``a/b/c``) below this one, each step checked; None where one is missing."""
        current: SafeDir | None = self
        opened: list[SafeDir] = []
        for part in [p for p in rel.split("/") if p]:
            assert current is not None
            nxt = current.sub(part, create)
            if nxt is None:
                break
            opened.append(nxt)
            current = nxt
        else:
            for d in opened[:-1]:
                d.close()
            return opened[-1] if opened else SafeDir(os.dup(self.fd), self.path, self.budget)
        for d in opened:
            d.close()
        return None

    # ---- reading ------------------------------------------------------------------------------------
    def kind(self, name: str) -> str | None:
        """``file`` | ``dir`` | ``link`` | ``special`` of a child, not following a link; None where missing."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _refusal(self._child(name), exc) from None
        if stat.S_ISREG(st.st_mode):
            return "file"
        if stat.S_ISDIR(st.st_mode):
            return "dir"
        return "link" if stat.S_ISLNK(st.st_mode) else "special"

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _refusal(self._child(name), exc) from None

    def names(self) -> list[str]:
        """The entries (charged to the budget before they are returned)."""
        try:
            with os.scandir(self.fd) as it:
                out = []
                for e in it:
                    self.budget.charge_entries(1)
                    out.append(e.name)
                return out
        except OSError as exc:
            raise _refusal(self.path, exc) from None

    def entries(self) -> Iterator[tuple[str, os.stat_result]]:
        """Each entry with its own stat (a link's, never its target's)."""
        for name in self.names():
            st = self.lstat(name)
            if st is not None:
                yield name, st

    def _open_regular(self, name: str) -> tuple[int, os.stat_result]:
        """A child opened for reading without following a link or blocking, and its stat; anything but a
        regular file (a FIFO, device or socket) is refused."""
        where = self._child(name)
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            raise _refusal(where, exc) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise CheckpointError(f"{where} is not a regular file (a FIFO, device or socket): refused")
        return fd, st

    def read(self, name: str, limit: int) -> bytes:
        """A regular file's bytes, at most ``limit`` + 1 (so the caller sees it was oversized), charged to the
        budget (refused before reading when they would not fit in it)."""
        fd, st = self._open_regular(name)
        try:
            want = min(limit + 1, st.st_size + 1)
            if want > self.budget.room() + 1:
                raise BudgetExceeded(
                    f"reading {self._child(name)} would take the request over {self.budget.max_bytes:,} bytes in total"
                )
            chunks, got = [], 0
            while got < want:
                chunk = os.read(fd, min(1 << 20, want - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
                self.budget.charge_bytes(len(chunk))
            return b"".join(chunks)
        finally:
            os.close(fd)

    def tail(self, name: str, max_bytes: int, since: int | None = None) -> tuple[bytes, int, int]:
        """The last ``max_bytes`` of a regular file (from ``since`` where given and still in the file), with the
        offset it starts at and the file's size."""
        fd, st = self._open_regular(name)
        try:
            size = st.st_size
            start = since if since is not None and since <= size else 0
            start = max(start, size - max_bytes)
            data = os.pread(fd, size - start, start)
            self.budget.charge_bytes(len(data))
            return data, start, size
        finally:
            os.close(fd)

    # ---- writing ------------------------------------------------------------------------------------
    def unlink(self, name: str) -> None:
        """A file (or link: the link itself, never its target); a missing one is fine."""
        self.budget.check_time()
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _refusal(self._child(name), exc) from None

    def write(self, name: str, data: bytes) -> None:
        """Through a hidden temporary name, renamed into place (as Spark writes its logs); never through a link."""
        tmp = f".{name}.zkc-tmp"
        self.unlink(tmp)
        try:
            fd = os.open(tmp, _WRITE_FLAGS, 0o644, dir_fd=self.fd)
        except OSError as exc:
            raise _refusal(self._child(tmp), exc) from None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def rmtree(self, name: str) -> None:
        """A child directory and everything in it; links inside are removed, never followed."""
        self.budget.check_time()
        if self.kind(name) not in ("dir", None):
            raise CheckpointError(f"{self._child(name)} is not a directory: refused")
        try:
            shutil.rmtree(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _refusal(self._child(name), exc) from None


assert shutil.rmtree.avoids_symlink_attacks, "this platform's rmtree follows links: not safe for checkpoints"
