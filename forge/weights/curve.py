"""CURVE security of the weight channel: key files in ZeroMQ's certificate format (``zmq.auth``), read and checked
with one-line errors, applied to the publisher's and the subscribers' sockets, the ZAP authenticator that admits
only the subscribers whose public keys the publisher was given, and the generation of a set of key files.

The publisher (learner) holds a server key pair and a directory of the public certificates of the actors it serves;
each subscriber (actor) holds its own key pair and the publisher's public certificate. A subscriber verifies the
publisher's key during the handshake (a forged publisher cannot serve), the publisher's authenticator refuses any
client key it was not given, and everything after the handshake is encrypted."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

PUBLIC_SUFFIX = ".key"             # zmq.auth's names: NAME.key holds the public key, NAME.key_secret the pair
SECRET_SUFFIX = ".key_secret"
SERVER_NAME = "learner"
CLIENTS_DIR = "clients"
KEY_LENGTH = 40                    # Z85 text of a 32-byte Curve25519 key


class KeyFileError(ValueError):
    """A key file or directory that cannot be used; the message is one line naming the file."""


@dataclass(frozen=True)
class ServerKeys:
    """The publisher's key pair and the public keys (Z85) of the subscribers it admits."""

    public: bytes
    secret: bytes = field(repr=False)
    clients: frozenset[bytes]
    clients_dir: Path


@dataclass(frozen=True)
class ClientKeys:
    """A subscriber's key pair and the publisher's public key (all Z85)."""

    public: bytes
    secret: bytes = field(repr=False)
    server: bytes


def _key(text: bytes | None, what: str, path: Path) -> bytes:
    if text is None:
        raise KeyFileError(f"{path} has no {what} line: not a ZeroMQ certificate (make one with forge keys weights)")
    try:
        valid = len(text) == KEY_LENGTH and len(z85.decode(text)) == 32
    except (ValueError, KeyError, IndexError, TypeError):
        valid = False
    if not valid:
        raise KeyFileError(f"{path}: its {what} is not a {KEY_LENGTH}-character Z85 CURVE key")
    return text


def _read(path: Path) -> tuple[bytes | None, bytes | None]:
    if not path.is_file():
        raise KeyFileError(f"cannot read the key file {path}: no such file")
    try:
        return zmq.auth.load_certificate(path)
    except ValueError:
        return None, None
    except OSError as exc:
        raise KeyFileError(f"cannot read the key file {path}: {exc.strerror or exc}") from None


def load_key_pair(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) of a ``*.key_secret`` certificate; refused unless the two keys belong together and only
    its owner may read the file."""
    path = Path(path)
    public, secret = _read(path)
    public = _key(public, "public-key", path)
    if secret is None:
        raise KeyFileError(f"{path} holds no secret-key: give the key pair file (*{SECRET_SUFFIX}), not the public "
                           f"certificate")
    secret = _key(secret, "secret-key", path)
    if zmq.curve_public(secret) != public:
        raise KeyFileError(f"{path}: its secret-key does not belong to its public-key")
    mode = stat.S_IMODE(path.stat().st_mode)
    if os.name == "posix" and mode & 0o077:
        raise KeyFileError(f"{path} may be read by other users (mode {mode:04o}): chmod 600 it")
    return public, secret


def load_public_key(path: Path) -> bytes:
    """The public key of a certificate (``*.key``; a key pair file gives its public half too)."""
    path = Path(path)
    return _key(_read(path)[0], "public-key", path)


def load_client_keys(directory: Path) -> frozenset[bytes]:
    """The public keys of every ``*.key`` certificate in ``directory``; refused when it holds none."""
    directory = Path(directory)
    if not directory.is_dir():
        raise KeyFileError(f"cannot read the client key directory {directory}: no such directory")
    try:
        files = sorted(directory.glob("*" + PUBLIC_SUFFIX))
    except OSError as exc:
        raise KeyFileError(f"cannot read the client key directory {directory}: {exc.strerror or exc}") from None
    if not files:
        raise KeyFileError(f"{directory} holds no public certificates (*{PUBLIC_SUFFIX}): no actor could fetch "
                           f"weights")
    return frozenset(load_public_key(file) for file in files)


def server_keys(key_file: Path, clients_dir: Path) -> ServerKeys:
    public, secret = load_key_pair(key_file)
    return ServerKeys(public, secret, load_client_keys(clients_dir), Path(clients_dir))


def client_keys(key_file: Path, server_file: Path) -> ClientKeys:
    public, secret = load_key_pair(key_file)
    return ClientKeys(public, secret, load_public_key(server_file))


def check_key_pair(path: Path) -> None:
    load_key_pair(path)


def check_public_key(path: Path) -> None:
    load_public_key(path)


def check_client_keys(directory: Path) -> None:
    load_client_keys(directory)


def secure_server(socket: zmq.Socket, keys: ServerKeys) -> None:
    """Make ``socket`` (before it binds) a CURVE server with the publisher's key pair."""
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_server = True


def secure_client(socket: zmq.Socket, keys: ClientKeys) -> None:
    """Make ``socket`` (before it connects) a CURVE client that only talks to the publisher holding ``keys.server``."""
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_serverkey = keys.server


def start_authenticator(context: zmq.Context, keys: ServerKeys) -> ThreadAuthenticator:
    """The ZAP handler of ``context``, admitting only ``keys.clients``; start it before any CURVE server binds (a
    context without one would admit every client key)."""
    authenticator = ThreadAuthenticator(context)
    try:
        authenticator.start()
    except zmq.ZMQError as exc:
        raise RuntimeError(f"cannot start the CURVE authenticator: {exc.strerror} (one authenticator per ZeroMQ "
                           f"context: give each publisher a context of its own)") from exc
    authenticator.configure_curve(domain="*", location=str(keys.clients_dir))
    admitted = set(authenticator.certs.get("*", {}))
    if not admitted:      # configure_curve logs instead of raising: refuse to serve with a failed list
        authenticator.stop()
        raise KeyFileError(f"{keys.clients_dir}: the authenticator loaded no client keys")
    return authenticator


@dataclass(frozen=True)
class KeySet:
    """The files ``create_keys`` wrote: the publisher's pair and public certificate, the directory of client
    certificates, and each client's key pair by name."""

    server_secret: Path
    server_public: Path
    clients_dir: Path
    client_secrets: dict[str, Path]


def create_publisher_keys(directory: Path) -> tuple[Path, Path]:
    """Write a publisher key pair alone into ``directory`` (created with mode 0700; the pair 0600): another learner
    serving the clients of a ``create_keys`` set. Returns (``learner.key_secret``, ``learner.key``); refuses to
    overwrite."""
    directory = Path(directory)
    planned = [directory / (SERVER_NAME + PUBLIC_SUFFIX), directory / (SERVER_NAME + SECRET_SUFFIX)]
    existing = [p for p in planned if p.exists()]
    if existing:
        raise FileExistsError(f"{existing[0]} exists: key files are never overwritten (choose a new directory)")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    previous = os.umask(0o077)
    try:
        public, secret = zmq.auth.create_certificates(directory, SERVER_NAME)
        os.chmod(public, 0o644)
    finally:
        os.umask(previous)
    return Path(secret), Path(public)


def create_keys(directory: Path, clients: Sequence[str]) -> KeySet:
    """Write a publisher key pair and one key pair per name in ``clients`` into ``directory`` (created with mode
    0700; key pair files 0600). Layout: ``learner.key`` and ``learner.key_secret``; ``clients/NAME.key`` (the
    publisher's list of admitted actors); ``NAME.key_secret`` (each actor's pair). Refuses to overwrite."""
    directory = Path(directory)
    names = list(clients)
    if not names:
        raise ValueError("name at least one client")
    for name in names:
        if not name or name != Path(name).name or name.startswith(".") or name == SERVER_NAME:
            raise ValueError(f"bad client name {name!r}: a plain file name other than {SERVER_NAME!r}")
    if len(set(names)) != len(names):
        raise ValueError("client names must be unique")
    clients_dir = directory / CLIENTS_DIR
    planned = [directory / (SERVER_NAME + PUBLIC_SUFFIX), directory / (SERVER_NAME + SECRET_SUFFIX),
               *(clients_dir / (n + PUBLIC_SUFFIX) for n in names), *(directory / (n + SECRET_SUFFIX) for n in names)]
    existing = [p for p in planned if p.exists()]
    if existing:
        raise FileExistsError(f"{existing[0]} exists: key files are never overwritten (choose a new directory)")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    clients_dir.mkdir(mode=0o700, exist_ok=True)
    previous = os.umask(0o077)           # key pairs are never readable by others, not even for an instant
    try:
        server_public, server_secret = zmq.auth.create_certificates(directory, SERVER_NAME)
        client_secrets = {}
        for name in names:
            public, secret = zmq.auth.create_certificates(clients_dir, name)
            client_secrets[name] = directory / (name + SECRET_SUFFIX)
            os.replace(secret, client_secrets[name])
            os.chmod(public, 0o644)
        os.chmod(server_public, 0o644)
    finally:
        os.umask(previous)
    return KeySet(Path(server_secret), Path(server_public), clients_dir, client_secrets)
