"""Tailing the log file of a server opsctl did not start (``console --log URL=FILE``).

The file is named by ``--log URL=FILE`` or by ``log = "FILE"`` on a target of the
targets file; the server's row and drill-in then show what an opsctl run's do: the load
phase, the decisive error lines, the quiet tail (opsctl.console.judge_logview).

:class:`LogTail` holds at most WINDOW bytes of the file's end: the first read seeks to
the end minus WINDOW, later reads take only what was appended (and when more than
WINDOW arrived in between, only the last WINDOW of it). A file replaced under the same
name (another inode: logrotate's move-and-create) or truncated (copytruncate, ``>``)
is read again from its start (its last WINDOW bytes at most), counted as a rotation. A
missing or unreadable file is a reason shown on the row, never an error; the file is
looked for again on every read.

:class:`LoggedSource` wraps a FleetSource: every view whose server has a log carries
its :class:`~opsctl.console.judge_logview.LogFacts` (re-read at most every READ_EVERY_S); a
dead or unreachable server's reason gets the log's decisive lines, as an opsctl run's
does."""

from __future__ import annotations

import os
import time
from dataclasses import replace

from opsctl.console import judge_logview as logview
from opsctl.console.judge import DEAD, UNREACHABLE, EndpointView, FleetSnapshot
from opsctl.console.source import FleetSource, WrappedSource
from opsctl.errors import BadInput

WINDOW = 128 * 1024
READ_EVERY_S = 1.0


class LogTail:
    """The last WINDOW bytes of one log file, read incrementally across rotations."""

    def __init__(self, path: str, window: int = WINDOW) -> None:
        self.path = path
        self.window = window
        self.ident: tuple[int, int] | None = None  # (device, inode) of the file held
        self.offset = 0  # bytes of that file read so far (its end, as far as we know)
        self.buf = b""
        self.rotations = 0
        self.size: int | None = None
        self.cut = False  # the held text starts mid-file: its first line may be a part
        self._facts: logview.LogFacts | None = None

    def _forget(self) -> None:
        self.ident, self.offset, self.buf, self._facts = None, 0, b"", None

    def read(self) -> logview.LogFacts:
        """Read what was appended since the last call; the facts of the held end."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self.ident is not None:
                self.rotations += 1  # moved away: the next file is another one
            self._forget()
            return logview.missing(self.path, "log file not found", self.rotations)
        except OSError as exc:
            return logview.missing(self.path, f"cannot read it: {exc.strerror or exc}")
        ident = (st.st_dev, st.st_ino)
        first = self.ident is None
        if not first and (ident != self.ident or st.st_size < self.offset):
            self.rotations += 1
            self._forget()
            self.ident = ident  # a new file: from its start (its last window at most)
        if first:
            self.ident = ident
            self.offset = max(0, st.st_size - self.window)
        self.size = st.st_size
        if st.st_size > self.offset or self._facts is None:
            try:
                self._append(st.st_size)
            except OSError as exc:
                self._forget()
                return logview.missing(self.path, f"cannot read it: {exc.strerror or exc}")
            self._facts = logview.facts(
                self.path, self._text(), size=st.st_size, rotations=self.rotations
            )
        elif self._facts.size_bytes != st.st_size:
            self._facts = replace(self._facts, size_bytes=st.st_size)
        return self._facts

    def _append(self, size: int) -> None:
        start = max(self.offset, size - self.window)
        with open(self.path, "rb") as fh:
            fh.seek(start)
            data = fh.read(size - start)
        if start > self.offset:  # more than a window arrived: the gap is skipped
            self.buf = b""
        self.cut = start > 0 and not self.buf  # the first held line may be a part
        self.buf = (self.buf + data)[-self.window :]
        self.offset = start + len(data)

    def _text(self) -> str:
        buf = self.buf
        if self.cut or len(buf) >= self.window:
            nl = buf.find(b"\n")
            buf = buf[nl + 1 :] if nl >= 0 else buf
        return buf.decode(errors="replace")


def parse_log_option(spec: str) -> tuple[str, str]:
    """``URL=FILE`` -> (normalised URL, FILE); BadInput (exit 2) when malformed."""
    from opsctl.console.targets import normalise_url

    url, sep, path = spec.partition("=")
    if not sep or not url.strip() or not path.strip():
        raise BadInput(
            f"--log wants URL=FILE, got {spec!r}",
            hint="e.g. --log http://127.0.0.1:8000=/var/log/vllm/server.log",
        )
    try:
        return normalise_url(url.strip()), os.path.expanduser(path.strip())
    except BadInput as exc:
        raise BadInput(f"--log: {exc.message}", exc.hint) from None


class LoggedSource(WrappedSource):
    """A FleetSource whose views carry their server's log facts (``log``).

    Everything else is the wrapped source's (WrappedSource)."""

    def __init__(self, source: FleetSource, by_url: dict[str, str] | None = None) -> None:
        from opsctl.console.targets import endpoint_key

        super().__init__(source)
        self.by_key = {endpoint_key(u): p for u, p in (by_url or {}).items()}
        self.tails: dict[str, LogTail] = {}
        self.read_at: dict[str, float] = {}
        self.facts: dict[str, logview.LogFacts] = {}

    def _facts(self, path: str) -> logview.LogFacts:
        now = time.monotonic()
        if path not in self.facts or now - self.read_at.get(path, 0.0) >= READ_EVERY_S:
            tail = self.tails.setdefault(path, LogTail(path))
            self.facts[path] = tail.read()
            self.read_at[path] = now
        return self.facts[path]

    def with_log(self, v: EndpointView) -> EndpointView:
        """The view with its log's facts (load phase, error lines, quiet tail) added."""
        from opsctl.console.targets import endpoint_key

        path = self.by_key.get(endpoint_key(v.target.url)) if self.by_key else None
        path = path or v.target.log_file
        if not path:
            return v
        f = self._facts(path)
        reason = v.reason
        if v.state in (DEAD, UNREACHABLE) and f.decisive_lines:
            reason = f"{reason or v.state}; log: {' | '.join(f.decisive_lines)}"
        return replace(v, log=f, reason=reason)

    def collect(self) -> FleetSnapshot:
        """The wrapped source's snapshot, each endpoint with a log given its facts."""
        snap = self.source.collect()
        if not self.by_key and not any(v.target.log_file for v in snap.endpoints):
            return snap  # no log to tail: nothing to add (and nothing to pay per row)
        return replace(snap, endpoints=tuple(self.with_log(v) for v in snap.endpoints))
