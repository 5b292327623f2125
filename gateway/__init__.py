"""The middleware: the gateway (gRPC for white-box agents, OpenAI HTTP for black-box agents) and the Data Pool."""
