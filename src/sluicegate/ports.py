"""The gateway's port: taken before anything starts (an engine takes a minute to start, and
several workers share the port), so that a port in use stops start-up at once. Light on
purpose: the CLI and the supervisor take the port without loading the app."""

from __future__ import annotations

import errno
import os
import socket
import sys
from dataclasses import dataclass

from sluicegate.settings import Settings


class PortError(Exception):
    """The port cannot be had; one line for the operator."""


@dataclass
class HeldPort:
    """The gateway's port, held from before anything starts until the gateway exits."""

    sock: socket.socket
    """Bound, not listening: the one served on alone; with several workers, the supervisor's
    place in the port's SO_REUSEPORT group (each worker listens on a socket of its own)."""
    lock: socket.socket | None = None

    def close(self) -> None:
        self.sock.close()
        if self.lock is not None:
            self.lock.close()


def hold_port(settings: Settings) -> HeldPort:
    """Take the port before anything starts (an engine takes a minute), so that a port in use
    stops start-up at once with `PortError`:

    1. a lock that one gateway per port number holds in a network namespace (an abstract
       Unix socket, which the kernel frees when the process ends, however it ends): with
       SO_REUSEPORT, which the workers share the port by, the kernel would let a second
       gateway of the same user join them, and each would silently get part of the
       connections;
    2. a bind without SO_REUSEPORT, which fails while any other server listens on the port
       (one with SO_REUSEPORT of its own too);
    3. with several workers, the socket bound with SO_REUSEPORT that makes the group."""
    host, port, shared = settings.host, settings.port, settings.workers > 1
    lock = _port_lock(port)
    try:
        try:
            sock = bind_socket(host, port, reuse_port=False)
            if shared:
                sock.close()
                sock = bind_socket(host, port, reuse_port=True)
        except OSError as exc:
            raise PortError(f"cannot take {host}:{port}: {exc.strerror or exc}") from None
    except BaseException:
        if lock is not None:
            lock.close()
        raise
    return HeldPort(sock, lock)


def _port_lock(port: int) -> socket.socket | None:
    """The lock of `hold_port`; None where there are no abstract sockets (not Linux), or for
    port 0 (a port of its own each time)."""
    if port == 0 or not sys.platform.startswith("linux"):
        return None
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lock.bind(f"\0sluicegate-port-{port}")
    except OSError as exc:
        lock.close()
        if exc.errno != errno.EADDRINUSE:
            raise PortError(f"cannot lock port {port}: {exc.strerror or exc}") from None
        raise PortError(
            f"port {port} is taken by another sluicegate gateway on this host (in this "
            "network namespace): stop it, or set SLUICEGATE_PORT"
        ) from None
    # A process forked from this one (an engine core) must not hold the lock on past it.
    os.register_at_fork(after_in_child=lock.close)
    return lock


def bind_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A TCP socket bound to `host:port` (not listening yet), shared by the workers with
    `reuse_port`."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock
