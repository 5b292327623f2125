"""ZeroMQ endpoints of the weight transport: defaults (loopback), validation, and binding with a clear error."""

from __future__ import annotations

import zmq

# The weight channel's ports: the learner's (rank 0's) fetch and announcement endpoints, and those an actor re-serves
# the versions it applied on for its children in a relay tree. Deployments use them as they are.
WEIGHTS_FETCH_PORT = 5701
WEIGHTS_ANNOUNCE_PORT = 5702
RELAY_FETCH_PORT = 5703
RELAY_ANNOUNCE_PORT = 5704
# A Tinker server's adapter source (forge-tinker), apart from a learner's on the same host.
ADAPTER_SOURCE_FETCH_PORT = 5705
ADAPTER_SOURCE_ANNOUNCE_PORT = 5706
DEFAULT_FETCH_ENDPOINT = f"tcp://127.0.0.1:{WEIGHTS_FETCH_PORT}"
DEFAULT_ANNOUNCE_ENDPOINT = f"tcp://127.0.0.1:{WEIGHTS_ANNOUNCE_PORT}"
TRANSPORTS = ("tcp", "ipc", "inproc")


def check_endpoint(endpoint: object, role: str) -> str:
    """``endpoint`` if it is a string like ``tcp://host:port``, ``ipc:///path`` or ``inproc://name``."""
    if not isinstance(endpoint, str):
        raise TypeError(f"{role} endpoint must be a string such as {DEFAULT_FETCH_ENDPOINT}, got {endpoint!r}")
    transport, sep, address = endpoint.partition("://")
    if not sep or transport not in TRANSPORTS or not address:
        raise ValueError(f"bad {role} endpoint {endpoint!r}: expected tcp://host:port, ipc:///path or inproc://name")
    if transport == "tcp":
        host, colon, port = address.rpartition(":")
        if not colon or not host or not (port == "*" or (port.isdigit() and 0 < int(port) < 65536)):
            raise ValueError(f"bad {role} endpoint {endpoint!r}: a tcp endpoint needs a host and a port (or *)")
    return endpoint


def bind(socket: zmq.Socket, endpoint: str, role: str) -> str:
    """Bind ``socket``; returns the bound endpoint (the real port when the port is ``*``)."""
    try:
        socket.bind(check_endpoint(endpoint, role))
    except zmq.ZMQError as exc:
        raise OSError(f"cannot bind the {role} socket to {endpoint}: {exc.strerror}") from exc
    return socket.getsockopt_string(zmq.LAST_ENDPOINT)


def connect(socket: zmq.Socket, endpoint: str, role: str) -> None:
    try:
        socket.connect(check_endpoint(endpoint, role))
    except zmq.ZMQError as exc:
        raise ValueError(f"cannot connect the {role} socket to {endpoint}: {exc.strerror}") from exc
