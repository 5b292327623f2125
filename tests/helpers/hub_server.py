"""A stand-in for the Hugging Face Hub on a loopback port, as a real server process (aiohttp), for tests that run
huggingface_hub's own download code with no network: clients reach it through ``HF_ENDPOINT``.

It serves the repositories of a directory, ``ROOT/org/name/`` holding the files of model repository ``org/name``
(and ``ROOT/datasets/org/name/`` those of dataset repository ``org/name``, under the Hub's ``datasets`` paths),
each at one commit whose sha is derived from its files (git's blob ids), reachable as ``main`` or as the sha. A
repository may be gated (its listing is public, its files need ``Authorization: Bearer TOKEN`` with a known token) or
private (it does not exist without one). It implements what huggingface_hub 2.4's ``snapshot_download`` and
``hf_hub_download`` ask, with the Hub's headers and error codes:

- ``GET /api/models/ORG/NAME[/revision/REV]`` (``model_info``, ``repo_info``): the repository's id and ``sha``;
- ``GET /api/models/ORG/NAME/tree/REV[/PATH]`` (``list_repo_tree``, ``recursive``): the files, with their blob ids,
  sizes and LFS metadata (``*.safetensors`` are LFS files, as on the Hub);
- ``HEAD`` and ``GET /ORG/NAME/resolve/REV/PATH`` (``get_hf_file_metadata``, the download; ``Range`` resumes):
  ``X-Repo-Commit``, ``ETag`` (the blob id, or the LFS sha256 also as ``X-Linked-Etag``), ``Content-Length``;
- errors as the Hub gives them: ``X-Error-Code`` ``RepoNotFound`` (401 without a token, 404 with one),
  ``GatedRepo`` (401), ``RevisionNotFound`` and ``EntryNotFound`` (404), and 401 with ``X-Error-Message: Invalid
  credentials in Authorization header`` for an unknown token.

Run as a program (``python hub_server.py ROOT --ready-file FILE [--gated ORG/NAME] [--private ORG/NAME] [--token
TOKEN] [--requests FILE]``) it writes its URL to the ready file once serving, appends every request to the
requests file (JSON lines), and stops on SIGTERM. ``HubServer`` starts and stops it from a test.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".onnx")       # tracked by git-lfs, as on the Hub
EPOCH = "2025-01-01T00:00:00.000Z"


@dataclass
class File:
    path: str               # in the repository, with slashes
    local: Path
    size: int
    blob_id: str            # git's: sha1 of "blob SIZE\0" + content (of the pointer file for an LFS file)
    sha256: str | None      # an LFS file's

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id

    def tree_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": self.blob_id, "size": self.size, "path": self.path}
        if self.sha256 is not None:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": len(_pointer(self.sha256, self.size))}
        return entry


@dataclass
class Repo:
    repo_id: str
    files: dict[str, File]
    sha: str
    gated: bool = False
    private: bool = False
    revisions: set[str] = field(default_factory=set)

    def info(self) -> dict[str, Any]:
        return {"_id": self.sha[:24], "id": self.repo_id, "modelId": self.repo_id,
                "author": self.repo_id.split("/")[0], "sha": self.sha, "lastModified": EPOCH, "createdAt": EPOCH,
                "private": self.private, "gated": "manual" if self.gated else False, "disabled": False,
                "downloads": 0, "likes": 0, "tags": ["transformers", "safetensors"], "library_name": "transformers",
                "siblings": [{"rfilename": path} for path in sorted(self.files)]}


def _pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _blob_id(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def read_file(directory: Path, local: Path) -> File:
    content = local.read_bytes()
    path = local.relative_to(directory).as_posix()
    if local.suffix in LFS_SUFFIXES:
        sha256 = hashlib.sha256(content).hexdigest()
        return File(path, local, len(content), _blob_id(_pointer(sha256, len(content))), sha256)
    return File(path, local, len(content), _blob_id(content), None)


def read_repos(root: Path, gated: set[str], private: set[str], kind: str = "models") -> dict[str, Repo]:
    """Every repository of ``kind`` under ``root`` (models: ``org/name`` folders, datasets: ``datasets/org/name``),
    with its files and its commit's sha."""
    base = root / "datasets" if kind == "datasets" else root
    repos = {}
    for directory in sorted(p for p in base.glob("*/*") if p.is_dir()):
        if kind == "models" and directory.parent.name == "datasets" and directory.parent.parent == root:
            continue
        repo_id = directory.relative_to(base).as_posix()
        files = {f.path: f for f in (read_file(directory, p) for p in sorted(directory.rglob("*")) if p.is_file())}
        sha = hashlib.sha1("".join(f"{f.path}\0{f.blob_id}\n" for f in files.values()).encode()).hexdigest()
        repos[repo_id] = Repo(repo_id, files, sha, repo_id in gated, repo_id in private, {"main", sha})
    return repos


def _error(status: int, code: str | None, message: str, commit: str | None = None) -> web.Response:
    headers = {"X-Error-Message": message, **({"X-Error-Code": code} if code else {}),
               **({"X-Repo-Commit": commit} if commit else {})}
    return web.json_response({"error": message}, status=status, headers=headers)


class Hub:
    """The Hub's answers for one set of repositories and tokens."""

    def __init__(self, repos: dict[str, Repo], tokens: set[str], requests: Path | None,
                 datasets: dict[str, Repo] | None = None) -> None:
        self.repos = repos
        self.datasets = datasets or {}
        self.tokens = tokens
        self.requests = requests

    def _token(self, request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        return auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None

    def _repo(self, request: web.Request, files: bool = False) -> Repo | web.Response:
        """The repository the request names, or the Hub's refusal."""
        token = self._token(request)
        if token is not None and token not in self.tokens:
            return _error(401, None, "Invalid credentials in Authorization header")
        kind = self.datasets if request.match_info.get("kind") == "datasets" else self.repos
        repo = kind.get(f"{request.match_info['org']}/{request.match_info['name']}")
        if repo is None or (repo.private and token is None):
            return _error(401 if token is None else 404, "RepoNotFound", "Repository not found")
        if files and repo.gated and token is None:
            return _error(401, "GatedRepo", f"Access to model {repo.repo_id} is restricted. You must have access to "
                                            "it and be authenticated to access it. Please log in.")
        return repo

    def _revision(self, repo: Repo, request: web.Request) -> web.Response | None:
        revision = request.match_info.get("revision", "main")
        if revision not in repo.revisions:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return None

    async def info(self, request: web.Request) -> web.Response:
        repo = self._repo(request)
        if isinstance(repo, web.Response):
            return repo
        return self._revision(repo, request) or web.json_response(repo.info())

    async def tree(self, request: web.Request) -> web.Response:
        repo = self._repo(request)
        if isinstance(repo, web.Response):
            return repo
        refused = self._revision(repo, request)
        if refused is not None:
            return refused
        under = request.match_info.get("path", "").strip("/")
        prefix = f"{under}/" if under else ""
        inside = [f for f in repo.files.values() if f.path.startswith(prefix)]
        if under and not inside:
            return _error(404, "EntryNotFound", f"{under} does not exist on \"{repo.sha}\"", repo.sha)
        if request.query.get("recursive", "false").lower() == "true":
            return web.json_response([f.tree_entry() for f in inside])
        entries: dict[str, dict[str, Any]] = {}
        for f in inside:
            head, _, rest = f.path[len(prefix):].partition("/")
            entries[head] = {"type": "directory", "oid": repo.sha, "size": 0, "path": prefix + head} if rest \
                else f.tree_entry()
        return web.json_response(list(entries.values()))

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        repo = self._repo(request, files=True)
        if isinstance(repo, web.Response):
            return repo
        refused = self._revision(repo, request)
        if refused is not None:
            return refused
        found = repo.files.get(request.match_info["path"])
        if found is None:
            return _error(404, "EntryNotFound", "Entry not found", repo.sha)
        start = _range_start(request.headers.get("Range"), found.size)
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{found.etag}"', "Accept-Ranges": "bytes",
                   **({"X-Linked-Etag": f'"{found.etag}"', "X-Linked-Size": str(found.size)} if found.sha256 else {}),
                   **({"Content-Range": f"bytes {start}-{found.size - 1}/{found.size}"} if start else {})}
        response = web.StreamResponse(status=206 if start else 200, headers=headers)
        response.content_type = "application/octet-stream"
        response.content_length = found.size - start
        await response.prepare(request)
        if request.method != "HEAD":
            with found.local.open("rb") as handle:
                handle.seek(start)
                while chunk := handle.read(1 << 20):
                    await response.write(chunk)
        await response.write_eof()
        return response

    @web.middleware
    async def record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        if self.requests is not None:
            with self.requests.open("a") as log:
                log.write(json.dumps({"method": request.method, "path": request.path, "status": response.status,
                                      "token": self._token(request) is not None}) + "\n")
        return response

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.record])
        for api, files in (("/api/models/{org}/{name}", "/{org}/{name}"),
                           ("/api/{kind:datasets}/{org}/{name}", "/{kind:datasets}/{org}/{name}")):
            app.router.add_get(api, self.info)
            app.router.add_get(api + "/revision/{revision}", self.info)
            app.router.add_get(api + "/tree/{revision}", self.tree)
            app.router.add_get(api + "/tree/{revision}/{path:.+}", self.tree)
            app.router.add_get(files + "/resolve/{revision}/{path:.+}", self.resolve)
        return app


def _range_start(header: str | None, size: int) -> int:
    """Where ``Range: bytes=START-`` asks the body to start (0 without one)."""
    if not header or not header.startswith("bytes="):
        return 0
    start = header.removeprefix("bytes=").split("-", 1)[0]
    return min(int(start), size) if start.isdigit() else 0


async def serve(args: argparse.Namespace) -> None:
    root, gated, private = Path(args.root), set(args.gated), set(args.private)
    hub = Hub(read_repos(root, gated, private), set(args.token), Path(args.requests) if args.requests else None,
              read_repos(root, gated, private, "datasets"))
    runner = web.AppRunner(hub.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]            # the port the system picked
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    ready = Path(args.ready_file)
    temporary = ready.with_name(ready.name + ".tmp")
    temporary.write_text(json.dumps({"url": f"http://127.0.0.1:{port}", "pid": os.getpid()}))
    os.replace(temporary, ready)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="Directory of the repositories: ROOT/org/name/ holds one's files.")
    parser.add_argument("--ready-file", required=True, help="Written (JSON: url, pid) once serving.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--gated", action="append", default=[], metavar="ORG/NAME")
    parser.add_argument("--private", action="append", default=[], metavar="ORG/NAME")
    parser.add_argument("--token", action="append", default=[], help="A token that may read gated and private ones.")
    parser.add_argument("--requests", help="Append every request here (JSON lines: method, path, status, token).")
    asyncio.run(serve(parser.parse_args()))


# huggingface_hub's variables a test sets itself: none is inherited from the machine running the tests.
HUB_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ENDPOINT", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                 "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS")


def hub_env(home: Path, endpoint: str, **variables: str) -> dict[str, str]:
    """This process's environment for a client of the Hub at ``endpoint`` whose Hugging Face home (and so cache) is
    ``home``, with ``variables`` (``HF_TOKEN``, ``HF_HUB_OFFLINE``) on top and no other of huggingface_hub's."""
    kept = {name: value for name, value in os.environ.items() if name not in HUB_VARIABLES}
    return {**kept, "HF_HOME": str(home), "HF_ENDPOINT": endpoint, **variables}


def write_model_repo(root: Path, repo_id: str, seed: int = 0) -> Path:
    """A random-weight checkpoint of the tiny architecture as the Hub repository ``repo_id`` under ``root``, with
    files Forge does not load beside it (PyTorch and ONNX weights, a sub-folder), which a fetch must leave."""
    from forge.checkpoints import write_tiny_checkpoint

    directory = write_tiny_checkpoint(root / repo_id, seed=seed)
    (directory / "pytorch_model.bin").write_bytes(b"not loaded")
    (directory / "onnx").mkdir()
    (directory / "onnx" / "model.onnx").write_bytes(b"not loaded")
    (directory / "README.md").write_text(f"# {repo_id}\n")
    return directory


class HubServer:
    """This module's server as a process for a test: started on a free loopback port over ``root``, ready once
    its ready file appears, stopped by ``stop`` (or leaving the ``with`` block)."""

    def __init__(self, root: Path, directory: Path, *, gated: tuple[str, ...] = (), private: tuple[str, ...] = (),
                 tokens: tuple[str, ...] = ()) -> None:
        from helpers.waiting import wait_for

        directory.mkdir(parents=True, exist_ok=True)
        ready, self.requests_file = directory / "hub.json", directory / "hub-requests.jsonl"
        ready.unlink(missing_ok=True)
        self.log_path = directory / "hub.log"
        options = [*(("--gated", g) for g in gated), *(("--private", p) for p in private),
                   *(("--token", t) for t in tokens)]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, __file__, str(root), "--ready-file", str(ready),
                                          "--requests", str(self.requests_file),
                                          *(word for option in options for word in option)],
                                         stdout=log, stderr=subprocess.STDOUT)
        self.url = wait_for(lambda: ready.exists() and json.loads(ready.read_text())["url"],
                            "the Hub server's ready file", watched=[self.proc])

    def requests(self) -> list[dict[str, Any]]:
        """Every request served so far."""
        if not self.requests_file.exists():
            return []
        return [json.loads(line) for line in self.requests_file.read_text().splitlines()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> HubServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    main()
