"""Failed ZeroMQ handshakes on the weight channel's sockets, counted and reported: a CURVE key that the other side
refuses, or a peer with the other security mechanism, otherwise shows only as silence (ZeroMQ retries quietly).

``HandshakeWatch`` keeps a monitor socket per watched socket, to be polled by the thread that owns them; the first
failure after a success (or after the start) is a warning that says why, repeats are debug messages."""

from __future__ import annotations

import logging

import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)

_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
           | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_PROTOCOL_ERRORS = {
    zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: "the peer uses another security mechanism (CURVE on one side only)",
    zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: "the peer's CURVE handshake could not be decrypted (it expects another "
                                           "server key)",
}


def failure_reason(event: int, value: int) -> str:
    """Why a handshake failed, from a monitor event and its value."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"the publisher refused the subscriber's CURVE key (ZAP status {value}: not among its client keys)"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return _PROTOCOL_ERRORS.get(value, f"ZMTP protocol error {value:#x}")
    return ("the connection closed during the handshake (the peer refused it: a wrong server key, or another "
            "security mechanism)")


class HandshakeWatch:
    """Handshake outcomes of some sockets, read from their monitors by the sockets' owner thread."""

    def __init__(self, role: str, sockets: tuple[zmq.Socket, ...] = ()) -> None:
        self.role = role
        self.failures = 0
        self.last_error = ""
        self._monitors: dict[zmq.Socket, zmq.Socket] = {}      # watched socket -> its monitor
        self._warned = False
        for socket in sockets:
            self.watch(socket)

    def watch(self, socket: zmq.Socket, poller: zmq.Poller | None = None) -> None:
        monitor = socket.get_monitor_socket(_EVENTS)
        monitor.setsockopt(zmq.LINGER, 0)
        self._monitors[socket] = monitor
        if poller is not None:
            poller.register(monitor, zmq.POLLIN)

    def unwatch(self, socket: zmq.Socket, poller: zmq.Poller | None = None) -> None:
        monitor = self._monitors.pop(socket)
        if poller is not None:
            poller.unregister(monitor)
        self._read(monitor)
        socket.disable_monitor()
        monitor.close(linger=0)

    def register(self, poller: zmq.Poller) -> None:
        for monitor in self._monitors.values():
            poller.register(monitor, zmq.POLLIN)

    def read(self, events: dict) -> None:
        """Consume the monitors' events among ``events`` (a poll's result)."""
        for monitor in self._monitors.values():
            if monitor in events:
                self._read(monitor)

    def close(self) -> None:
        for socket in list(self._monitors):
            self.unwatch(socket)

    def _read(self, monitor: zmq.Socket) -> None:
        while True:
            try:
                message = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            except zmq.ZMQError:        # the monitor was torn down with its socket
                return
            event, value = message["event"], message["value"]
            endpoint = message["endpoint"].decode(errors="replace")
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._warned = False
                continue
            self.failures += 1
            self.last_error = failure_reason(event, value)
            level = logging.DEBUG if self._warned else logging.WARNING
            log.log(level, "%s: handshake on %s failed: %s", self.role, endpoint, self.last_error)
            self._warned = True
