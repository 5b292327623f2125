"""The gateway's OpenAI-compatible HTTP front end (aiohttp): chat completions (streaming too), models, sessions."""

from forge.gateway.http.app import HttpFrontEnd

__all__ = ["HttpFrontEnd"]
