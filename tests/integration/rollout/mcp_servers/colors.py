"""An MCP tool server over stdio (the mcp package's own MCPServer): ``lookup`` gives a key's color and writes a
line to the file named by ``--log`` (one server process per session shows as one pid per session there). The key
"bell" crashes the server, as a broken tool server would."""

import argparse
import os

from mcp.server.mcpserver import MCPServer

COLORS = {"cup": "red", "box": "blue", "pen": "green", "hat": "black", "key": "white", "bag": "gold",
          "lamp": "gray", "book": "pink", "ring": "red", "coin": "gold", "shoe": "black"}

server = MCPServer("colors")
LOG = {"path": ""}


@server.tool()
def lookup(key: str) -> str:
    """Color of a key."""
    with open(LOG["path"], "a") as log:
        log.write(f"{os.getpid()} {key}\n")
    if key == "bell":
        os._exit(3)
    return f"{COLORS.get(key, 'unknown')} (from the MCP server)"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    LOG["path"] = parser.parse_args().log
    server.run()
