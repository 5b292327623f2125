"""Generated gRPC stubs of Forge's wire contracts (package ``forge.v1``); regenerate with ``make protos``."""
