"""Shared gRPC plumbing: the server helpers, threaded (``server``) and asyncio (``aio_server``; health, reflection,
loopback, API keys, graceful stop), and clients."""

from forge.rpc.client import connect
from forge.rpc.server import GrpcServer, ServerOptions, ServiceBinding, serve

__all__ = ["GrpcServer", "ServerOptions", "ServiceBinding", "connect", "serve"]
