"""The link between a run's drivers and its Space, as a TCP proxy the campaign can cut.

A ``LinkProxy`` listens on 127.0.0.1 and forwards each connection to the Space's daemon
(its endpoint looked up again for every new connection, so a restarted or rebuilt Space is
found). ``cut`` is a partition: from that instant nothing more crosses in either direction,
new connections are taken but never forwarded, and what was already delivered to the daemon
is carried out there while its answer stays on the far side. ``heal`` resets every
connection that lived through the cut (what it held is lost, as a partition loses it) and
forwards again. A client meets a cut as a request with no answer in time: its outcome is
unknown. ``slow`` delays what crosses instead: each burst of bytes (a request, an answer)
waits that long before it goes on, so a request its client gave up on still reaches the
daemon after the client did, maybe after the client's next request.

Drivers reach the proxy through ``LinkTable``: the runner writes the proxy's port under the
Space's name in a directory the drivers are given (``python -m chaos.driver --links DIR``),
and their Spaces provider routes its clients there (``via``). The proxy owns its threads
and sockets; ``close`` ends them all.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from backends.space_client import Endpoint

#: How often a pump looks at the link's state while nothing moves (seconds).
POLL_S = 0.05
#: Bytes read from one side within this long of the last ones it passed on a slow link,
#: with nothing passed the other way between, belong to the same burst (one message in
#: parts) and are not delayed again (seconds).
BURST_S = 0.05
_CHUNK = 64 * 1024


def _reset(sock: socket.socket) -> None:
    """End a connection with a reset (SO_LINGER 0): the peer sees it broken, not ended. The
    shutdown first wakes a thread of ours blocked sending on it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class LinkProxy:
    """A proxy to the endpoint ``resolve`` gives (host and port; the token passes through
    with each request). Use as a context manager, or ``close`` it."""

    def __init__(self, resolve: Callable[[], Endpoint], *, connect_for: float = 5.0) -> None:
        self._resolve = resolve
        #: How long a connection waits for a daemon to reach (one restarting) before the
        #: client is reset, as a client of its own would try again.
        self.connect_for = connect_for
        self._lock = threading.Lock()
        self._up = threading.Event()
        self._up.set()
        #: Bumped by every cut: a connection that lived through one (open when it began, or
        #: made during it) is reset at the heal.
        self._cuts = 0
        #: How long each burst waits before it crosses (``slow``; 0: not at all).
        self._delay = 0.0
        #: The longest delay the link was slowed by (what ``drain`` may have to wait out).
        self._longest = 0.0
        #: Connections with a request that met a delay and was not answered yet (``drain``).
        self._late = 0
        #: Notified when the link's state changes (``slow``, cut, heal, close, a late
        #: request answered): a cut or a close ends a burst's wait, ``drain`` wakes.
        self._changed = threading.Condition(self._lock)
        self._pairs: dict[socket.socket, tuple[socket.socket | None, int]] = {}
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)  # a heal drains it while the accept thread waits
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._acceptor = self._spawn(self._accept, "link-accept")

    def __enter__(self) -> LinkProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def cut(self) -> None:
        """Nothing crosses the link from now on, until ``heal``."""
        with self._lock:
            self._cuts += 1
            self._up.clear()
            self._changed.notify_all()

    def heal(self) -> None:
        """Reset every connection that lived through a cut (those the kernel made during it
        and no thread took yet too), then forward again."""
        with self._lock:
            doomed: list[socket.socket] = []
            while True:  # made during the cut, never accepted: lived through it
                try:
                    doomed.append(self._listener.accept()[0])
                except OSError:
                    break
            for client, (upstream, cuts) in list(self._pairs.items()):
                if cuts < self._cuts:
                    del self._pairs[client]
                    doomed += [client] if upstream is None else [client, upstream]
            for sock in doomed:  # before the link is up: nothing they hold crosses
                _reset(sock)
            self._up.set()
            self._changed.notify_all()

    def slow(self, delay: float) -> None:
        """Each burst of bytes that crosses from now on (either way, on every connection)
        waits ``delay`` seconds first; 0 makes the link fast again for what comes next,
        while what was waiting still waits out its own delay."""
        with self._lock:
            self._delay = delay
            self._longest = max(self._longest, delay)
            self._changed.notify_all()

    def drain(self, grace: float = 30.0) -> None:
        """Wait until every request a delay met was answered by the daemon (or its
        connection ended): then all a slow link held back has been carried out, as a
        network eventually delivers what it queued. Waits at most the longest delay plus
        ``grace`` seconds, then raises ``TimeoutError`` saying how many are still out."""
        with self._lock:
            deadline = time.monotonic() + self._longest + grace
            while self._late and not self._closed.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{self._late} request(s) the slow link delayed were still "
                        f"unanswered after the longest delay ({self._longest:g} s) and "
                        f"{grace:g} s more")
                self._changed.wait(left)

    @property
    def is_cut(self) -> bool:
        return not self._up.is_set()

    def close(self) -> None:
        """Stop listening, reset every connection and end every thread of the proxy (the
        link stays as it is: a cut one forwards nothing more)."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            self._changed.notify_all()
        self._acceptor.join(timeout=10)  # no new connection after this
        with self._lock:
            pairs, self._pairs = list(self._pairs.items()), {}
            self._listener.close()
        for client, (upstream, _) in pairs:
            _reset(client)
            if upstream is not None:
                _reset(upstream)
        for thread in self._threads:
            thread.join(timeout=10)

    # ---------------------------------------------------------------- the threads

    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return thread

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                ready, _, _ = select.select([self._listener], [], [], POLL_S)
            except (OSError, ValueError):
                return
            if not ready:
                continue
            with self._lock:  # the link's state just before the kernel's connection is taken
                cuts, up = self._cuts, self._up.is_set()
            try:
                client, _ = self._listener.accept()
            except BlockingIOError:
                continue  # a heal drained it
            except OSError:
                return
            client.setblocking(True)
            with self._lock:
                lived = not up or self._cuts != cuts
                if self._closed.is_set() or (lived and self._up.is_set()):
                    _reset(client)  # it lived through a cut already healed
                    continue
                self._pairs[client] = (None, self._cuts - lived)
            self._spawn(self._serve, "link-pump", client)

    def _listed(self, client: socket.socket) -> bool:
        return not self._closed.is_set() and client in self._pairs

    def _serve(self, client: socket.socket) -> None:
        """Forward one connection: connect upstream once the link is up, then pump."""
        while not self._up.wait(POLL_S):
            if not self._listed(client):
                return
        upstream = None
        deadline = time.monotonic() + self.connect_for
        while upstream is None and self._listed(client):
            try:
                ep = self._resolve()
                upstream = socket.create_connection((ep.host, ep.port), timeout=10)
                upstream.settimeout(None)
            except Exception:  # noqa: BLE001 - no daemon to reach yet (restarting, gone)
                if time.monotonic() > deadline:
                    break
                time.sleep(POLL_S)
        with self._lock:
            if upstream is not None and client in self._pairs and not self._closed.is_set():
                self._pairs[client] = (upstream, self._pairs[client][1])
            else:  # nothing to reach, or reset by a heal or the close meanwhile
                if self._pairs.pop(client, None) is not None:
                    _reset(client)
                if upstream is not None:
                    _reset(upstream)
                return
        self._pump(client, upstream)

    def _wait_out(self) -> bool:
        """A new burst waits out the link's delay as it was when the burst came, even if
        the link is made fast meanwhile (as a real network's queue: what is in it arrives
        late, after what is sent later on another connection); whether it may then cross
        (the link up, not closed). The pair's listing is checked by the caller's loop."""
        with self._lock:
            deadline = time.monotonic() + self._delay
            while self._up.is_set() and not self._closed.is_set() and \
                    (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            return self._up.is_set() and not self._closed.is_set()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        ends = {client: upstream, upstream: client}
        # When each side last passed bytes on, and which side did last: a read from that
        # side soon after is the same burst; one after an answer is the next message.
        passed = {client: 0.0, upstream: 0.0}
        last: socket.socket | None = None
        late = False  # a request that met a delay is not answered yet (counted in _late)
        gone = False  # its client left meanwhile: only the daemon's answer is waited for
        try:
            while not self._closed.is_set():
                if not self._up.wait(POLL_S):  # cut: nothing read, nothing sent
                    if client not in self._pairs:
                        return
                    continue
                readable, _, _ = select.select([upstream] if gone else list(ends), [], [],
                                               POLL_S)
                for sock in readable:
                    with self._lock:  # still listed and up: what it holds may cross
                        if not self._up.is_set() or client not in self._pairs:
                            break
                    data = sock.recv(_CHUNK)
                    if not data:
                        if sock is client and late:
                            gone = True  # its late request still reaches the daemon,
                            upstream.shutdown(socket.SHUT_WR)  # whole or cut short
                            break
                        raise ConnectionError("one side ended")
                    new_burst = last is not sock or time.monotonic() - passed[sock] > BURST_S
                    if sock is upstream:
                        late = self._answered(late)
                        if gone:
                            raise ConnectionError("the client left; the daemon answered")
                    elif new_burst:
                        late = self._met_delay(late)
                    if new_burst and not self._wait_out():
                        break  # cut or closed meanwhile: held, then lost at the heal
                    passed[sock], last = time.monotonic(), sock
                    ends[sock].sendall(data)  # even if its sender left meanwhile
        except (OSError, ValueError):  # broken, or reset by a heal or the close (fd gone)
            pass
        finally:
            self._answered(late)
            with self._lock:
                owned = self._pairs.pop(client, None) is not None
            if owned:
                client.close()
                upstream.close()

    def _met_delay(self, late: bool) -> bool:
        """A request is about to wait out the link's delay: count its connection as late
        (``drain``) until the daemon answers it. Whether the connection is late now."""
        with self._lock:
            if self._delay and not late:
                self._late += 1
                return True
            return late

    def _answered(self, late: bool) -> bool:
        """The daemon answered (or the connection ended): not late any more."""
        if late:
            with self._lock:
                self._late -= 1
                self._changed.notify_all()
        return False


class LinkTable:
    """Where drivers find the proxies of a run's Spaces: a directory with one file per
    Space name holding its proxy's port. ``route`` is a Spaces provider's ``via``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def publish(self, space: str, proxy: LinkProxy) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f".{space}.tmp"
        tmp.write_text(f"{proxy.port}\n")
        tmp.replace(self.directory / space)

    def route(self, space: str, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` of ``space``, through its proxy when the run has one."""
        try:
            port = int((self.directory / space).read_text())
        except (OSError, ValueError):
            return endpoint
        return Endpoint("127.0.0.1", port, endpoint.token, keep_alive=endpoint.keep_alive)
