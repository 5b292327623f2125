"""The gateway's OpenAI-compatible HTTP front end (aiohttp): chat completions (streaming too), models, sessions.
The server is ``forge.gateway.http.app.HttpFrontEnd``."""
