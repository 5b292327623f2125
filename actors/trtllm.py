"""placeholder"""


def backend_unavailable(name: str) -> str:
    return f"backend {name!r} is not available yet"
