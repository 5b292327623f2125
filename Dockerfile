# CPU image: installs Forge and runs its test suite by default.
#   docker build -t forge-cpu . && docker run --rm forge-cpu
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends make git gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/forge

# Torch first, from PyTorch's CPU index (a bare `torch` requirement would pull a multi-GB CUDA build).
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY . .
RUN pip install -e ".[dev]"

CMD ["python", "-m", "pytest", "-q"]
