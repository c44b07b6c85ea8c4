"""The lookups between vLLM's scheduler and its workers when they run in processes of their own
(vLLM's multiprocess executor): each worker answers on a Unix socket in a private directory,
and the scheduler asks every worker, offering a chunk only when every one holds it."""

from __future__ import annotations

import errno
import hashlib
import os
import select
import socket
import stat
import struct
import tempfile
import threading
import time
from typing import Optional

import numpy as np

import swiftkv

from .common import MAX_NAME_BYTES, log

# The lookup protocol between a scheduler and workers in other processes: a request is a header
# ("SKVQ", version, name_bytes, n) and n chunk names of name_bytes bytes each; an answer
# ("SKVA", version, status, n) and n bytes: a Tier per chunk (status 0) or an error message
# (status 1). A worker reads no more names than the engine's longest sequence has chunks.
HEAD = struct.Struct("<4sHHI")
PROTOCOL = 2


def socket_path(opts: dict, engine_id: str, rank: int) -> str:
    """Where worker `rank` of an engine answers lookups: a socket in a directory of this user's
    that nobody else may enter (a lookup tells which prompts were seen)."""
    d = opts["socket_dir"] or os.path.join(tempfile.gettempdir(), f"swiftkv-vllm-{os.getuid()}")
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ValueError(f"SwiftKVConnector: socket_dir {d} must be a directory owned by this "
                         "user that others cannot enter (mode 0700)")
    name = hashlib.sha256(engine_id.encode()).hexdigest()[:24]
    path = os.path.join(d, f"{name}.{rank}.sock")
    if len(path.encode()) > 107:
        raise ValueError(f"SwiftKVConnector: socket path {path} is longer than a Unix socket's "
                         "107 bytes: choose a shorter socket_dir")
    return path


def recv_exact(sock: socket.socket, n: int) -> Optional[bytearray]:
    """n bytes from sock, or None if the peer closed it before the first. The buffer starts at
    64 KiB at most and doubles as the bytes come, so a header that announces a large body and
    sends none costs its reader little."""
    buf = bytearray(min(n, 1 << 16))
    got = 0
    while got < n:
        if got == len(buf):
            buf.extend(bytes(min(n - got, got)))
        with memoryview(buf) as view:
            k = sock.recv_into(view[got:])
        if k == 0:
            if got == 0:
                return None
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return buf


class LookupServer:
    """A worker's answers to its scheduler's lookups and cache resets, when the scheduler runs
    in another process: one thread accepts, one thread serves each connection (vLLM's scheduler
    makes one). A lookup is "SKVQ" with n chunk names, answered "SKVA" with a tier a chunk; a
    reset "SKVR" with none, answered "SKVA" with the chunks dropped (8 bytes); status 1 with the
    library's message where either failed. A lookup of more than max_names names, or of names
    longer than the library takes, closes the connection before its body is read.

    Bounded: at most max_conns connections at once (one more is closed as it comes, and
    logged); a connection that sends nothing for idle_s is closed (the scheduler connects again
    at its next lookup), and one that stops for message_s within a message's body or an
    answer's send too. The accepting thread closes them as it wakes, at least every
    min(idle_s, message_s) / 4; the serving threads block in plain reads."""

    _IDLE, _RECEIVING, _WORKING, _SENDING = range(4)

    def __init__(self, model, path: str, reset=None, max_names: int = 1 << 16,
                 max_conns: int = 32, idle_s: float = 600.0, message_s: float = 10.0):
        self.path = path
        self._model = model
        self._max_names = max_names
        self._max_conns = max_conns
        self._idle_s = idle_s
        self._message_s = message_s
        self._refused = 0  # connections closed at the bound
        self._reset = reset  # () -> chunks dropped (Store.reset)
        self._lock = threading.Lock()
        self._conns: dict = {}  # connection -> (what it does, since when): for the reaper
        self._threads: list = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._bind()
            self._sock.listen(16)
        except BaseException:
            self._sock.close()
            raise
        self._accepter = threading.Thread(target=self._accept, name="swiftkv-lookups",
                                          daemon=True)
        self._accepter.start()

    def _bind(self) -> None:
        try:
            self._sock.bind(self.path)
            return
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
        # A socket left by an engine that died, or one an engine with this id serves now.
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.path)
        except (ConnectionRefusedError, FileNotFoundError):
            pass
        else:
            raise RuntimeError(f"SwiftKVConnector: {self.path} is served by a live engine with "
                               "this engine id")
        finally:
            probe.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self._sock.bind(self.path)

    def _accept(self) -> None:
        self._sock.settimeout(min(self._idle_s, self._message_s) / 4)
        while True:
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                self._reap()
                continue
            except OSError:
                return  # closed
            conn.settimeout(None)
            with self._lock:
                if self._sock.fileno() < 0:
                    conn.close()
                    return
                self._threads = [t for t in self._threads if t.is_alive()]
                if len(self._conns) >= self._max_conns:
                    self._refused += 1
                    if self._refused == 1 or self._refused % 1000 == 0:
                        log.warning("SwiftKVConnector: %d lookup connections are open on %s, "
                                    "the most it serves: one more closed (%d so far)",
                                    len(self._conns), self.path, self._refused)
                    conn.close()
                    continue
                self._conns[conn] = (self._IDLE, time.monotonic())
                t = threading.Thread(target=self._serve, args=(conn,), name="swiftkv-lookup",
                                     daemon=True)
                self._threads.append(t)
            t.start()
            self._reap()

    def _reap(self) -> None:
        """Closes the connections idle for idle_s, or stopped for message_s mid-message."""
        now = time.monotonic()
        with self._lock:
            for conn, (doing, since) in list(self._conns.items()):
                limit = (self._idle_s if doing == self._IDLE else
                         None if doing == self._WORKING else self._message_s)
                if limit is not None and now - since > limit:
                    # It stops counting against max_conns before its peer can see it closed:
                    # a client that connects again at once is not refused for it.
                    del self._conns[conn]
                    try:
                        conn.shutdown(socket.SHUT_RDWR)  # its thread's read or send ends
                    except OSError:
                        pass

    def _serve(self, conn: socket.socket) -> None:
        def doing(what):
            with self._lock:
                if conn in self._conns:  # (not one the reaper closed)
                    self._conns[conn] = (what, time.monotonic())

        try:
            while True:
                doing(self._IDLE)
                head = recv_exact(conn, HEAD.size)
                if head is None:
                    return
                magic, version, name_bytes, n = HEAD.unpack(head)
                if magic == b"SKVR" and version == PROTOCOL and n == 0 and self._reset:
                    doing(self._WORKING)  # a reset waits for the saves in flight
                    try:
                        body, status = struct.pack("<Q", self._reset()), 0
                    except swiftkv.Error as e:
                        body, status = str(e).encode(), 1
                    doing(self._SENDING)
                    conn.sendall(HEAD.pack(b"SKVA", PROTOCOL, status, len(body)) + body)
                    continue
                if (magic != b"SKVQ" or version != PROTOCOL or n > self._max_names
                        or not 0 < name_bytes <= MAX_NAME_BYTES):
                    log.error("SwiftKVConnector: a lookup that is not one (magic %r, version "
                              "%d, %d names of %d bytes) on %s: connection closed", magic,
                              version, n, name_bytes, self.path)
                    return
                doing(self._RECEIVING)
                names = recv_exact(conn, name_bytes * n) if n else bytearray()
                if names is None:
                    return
                doing(self._WORKING)
                try:
                    body, status = self._model.lookup_named(
                        np.frombuffer(names, dtype=np.uint8).reshape(n, name_bytes)) \
                        .residency.tobytes(), 0
                except swiftkv.Error as e:
                    body, status = str(e).encode(), 1
                doing(self._SENDING)
                conn.sendall(HEAD.pack(b"SKVA", PROTOCOL, status, len(body)) + body)
        except OSError:
            return  # the scheduler went, or close() shut the connection
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            conn.close()

    def close(self) -> None:
        """Stops answering; returns once no thread of the server uses the model."""
        with self._lock:
            for s in [self._sock, *self._conns]:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._sock.close()
            threads = list(self._threads)
        self._accepter.join()
        for t in threads:
            t.join()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


# Where a chunk held by several workers counts as held from, for vLLM's hit metrics: the
# farthest of their tiers. A chunk one worker lacks is not held.
FARNESS = np.full(256, 255, dtype=np.uint8)
for _i, _t in enumerate((swiftkv.Tier.PEER, swiftkv.Tier.HOST, swiftkv.Tier.REMOTE,
                         swiftkv.Tier.DISK, swiftkv.Tier.DROPPED)):
    FARNESS[int(_t)] = _i


class _Broken(Exception):
    """A lookup connection that cannot go on."""


# A worker closes a lookup connection idle for its idle_s (minutes): a connection used this
# recently is not looked at before a call (a select per worker would cost more than the call).
RECHECK_S = 0.25


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closed sock (or reset it): readable with nothing to read. Between
    calls a lookup connection has nothing to read, so anything else is a broken one too."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(r)


class LookupClient:
    """The scheduler's lookups across an engine's workers in other processes."""

    def __init__(self, paths: list, timeout_s: float):
        self._paths = paths
        self._timeout = timeout_s
        self._socks: Optional[list] = None
        self._used = 0.0  # when the connections last answered

    def _connect(self) -> list:
        socks = []
        try:
            for rank, path in enumerate(self._paths):
                deadline = time.monotonic() + self._timeout
                while True:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    try:
                        s.connect(path)
                        break
                    except (FileNotFoundError, ConnectionRefusedError) as e:
                        s.close()
                        if time.monotonic() > deadline:
                            raise RuntimeError(
                                f"SwiftKVConnector: worker {rank} does not answer lookups at "
                                f"{path} ({e.strerror}): its register_kv_caches did not run, or "
                                "it runs with another socket_dir or engine id") from None
                        time.sleep(0.02)
                s.settimeout(self._timeout)
                socks.append(s)
        except BaseException:
            for s in socks:
                s.close()
            raise
        return socks

    def _renew_closed(self) -> None:
        """A worker closes a connection idle for long (LookupServer's idle_s): each connection
        closed so is made again, with one try; one that cannot be (its worker is gone) stays
        closed, and the call fails on it as before."""
        for rank, s in enumerate(self._socks):
            if not closed_by_peer(s):
                continue
            fresh = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                fresh.connect(self._paths[rank])
            except OSError:
                fresh.close()
                continue
            fresh.settimeout(self._timeout)
            s.close()
            self._socks[rank] = fresh

    def _ask(self, what: str, head: bytes, body=b"") -> list:
        """head (and body) to every worker; their answers' bodies in rank order. Every answer
        that can come is read before a failure is raised: the connections stay in step, and
        what the reachable workers were asked (a reset) is done when this returns, whatever
        became of the others. A connection that cannot stay in step (a worker gone, an answer
        that is not one) closes them all, and the next call connects again."""
        if self._socks is None:
            self._socks = self._connect()
        elif time.monotonic() - self._used > RECHECK_S:
            self._renew_closed()
        answers, failed, broken = [], None, None
        sent = []
        for rank, s in enumerate(self._socks):
            try:
                s.sendall(head)
                if len(body):
                    s.sendall(body)
                sent.append((rank, s))
            except OSError as e:  # a worker gone: a reset or a broken pipe
                broken = broken or f"worker {rank}: {e.strerror or e}"
        for rank, s in sent:
            try:
                answer = recv_exact(s, HEAD.size)
                if answer is None:
                    raise _Broken(f"worker {rank} closed its connection")
                magic, _, status, n = HEAD.unpack(answer)
                data = recv_exact(s, n) if n else b""
                if magic != b"SKVA":
                    raise _Broken(f"worker {rank} answered with magic {magic!r}")
            except _Broken as e:
                broken = broken or str(e)
                continue
            except OSError as e:  # a timeout, a reset
                broken = broken or f"worker {rank}: {e.strerror or e}"
                continue
            if status and failed is None:
                failed = RuntimeError(f"SwiftKVConnector: worker {rank}'s {what} failed: "
                                      f"{bytes(data).decode(errors='replace')}")
            answers.append(data)
        self._used = time.monotonic()
        if broken is not None:
            self.close()
            raise RuntimeError(f"SwiftKVConnector: a {what} failed: {broken}")
        if failed is not None:
            raise failed
        return answers

    def lookup(self, names: np.ndarray) -> np.ndarray:
        """A Tier per named chunk (names: [n, name_bytes] uint8): where every worker holds it
        (the farthest of their tiers), DROPPED where any worker lacks it."""
        names = np.ascontiguousarray(names, dtype=np.uint8)
        body = memoryview(names.reshape(-1))
        out = None
        head = HEAD.pack(b"SKVQ", PROTOCOL, names.shape[1], names.shape[0])
        for data in self._ask("lookup", head, body):
            res = np.frombuffer(data, dtype=np.uint8)
            out = res.copy() if out is None else np.where(
                FARNESS[res] > FARNESS[out], res, out)
        return out

    def reset(self) -> int:
        """Every worker's cache reset (Store.reset): the chunks they dropped, all together."""
        answers = self._ask("cache reset", HEAD.pack(b"SKVR", PROTOCOL, 0, 0))
        for rank, data in enumerate(answers):
            if len(data) != 8:
                self.close()
                raise RuntimeError(f"SwiftKVConnector: a cache reset failed: worker {rank} "
                                   f"answered {len(data)} bytes")
        return sum(struct.unpack("<Q", data)[0] for data in answers)

    def close(self) -> None:
        for s in self._socks or []:
            s.close()
        self._socks = None
