"""Models named by their Hugging Face id, ``org/name`` or ``org/name@revision`` (a branch, a tag or a commit), in two
steps kept apart:

- ``parse_hub_id`` reads an id's syntax and nothing else: settings validators run it, so no check of a setting ever
  touches the network (nor the cache).
- ``fetch_snapshot`` downloads what Forge loads of the model (``HUB_FILES``: config and generation config, the
  tokenizer files and chat template, the ``*.safetensors`` weights and their index, at the repository's top level; no
  .bin, .pt, .gguf or ONNX files) into huggingface_hub's cache with ``snapshot_download``; ``cached_snapshot`` finds
  it there without the network.

All that concerns the Hub is huggingface_hub's own, read by it: the cache (``HF_HOME``, ``HF_HUB_CACHE``), offline
mode (``HF_HUB_OFFLINE``), the token (``HF_TOKEN``, or the one ``hf auth login`` saved) and the endpoint
(``HF_ENDPOINT``). Every failure is a ``HubError`` saying in one line what to do.

Who fetches: the entry points, once per node, in their own process (``forge up`` before it starts any service,
``forge model fetch``, the other ``forge model`` commands). The services (the learner and each of its ranks, the
actors, the gateway) only read the cache: their settings name the id and they find its snapshot there, never the
network. They are given the id rather than the snapshot directory because the id is what the model serves under (the
gateway's model id, the actors' KV salts, a LoRA adapter's base model), the same on every node whatever the cache's
path there, and because a service started apart (a Slurm job step after ``forge model fetch``) then resolves it exactly
as one that forge up starts. forge up also gives its services ``HF_HUB_OFFLINE=1``, so that nothing inside them
(transformers, vLLM) asks the Hub either.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HUB_FILES", "NOT_FETCHED", "HubError", "HubId", "cached_snapshot", "fetch_dataset", "fetch_snapshot",
           "parse_hub_id"]

# What Forge (and the vLLM and TensorRT-LLM backends) read of a checkpoint: fnmatch patterns of its files.
HUB_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
             "chat_template.jinja", "chat_template.json", "*.safetensors", "*.safetensors.index.json")
# Never fetched: sub-folders (Forge reads a checkpoint's top level) and Mistral's consolidated.safetensors, a second
# copy of the weights in Mistral's own layout.
NOT_FETCHED = ("*/*", "consolidated*")

_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[A-Za-z0-9_.][A-Za-z0-9_./-]*))?")


@dataclass(frozen=True)
class HubId:
    """A model on the Hub: its repository and the revision asked for (None: the default branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}" if self.revision else self.repo_id


class HubError(ValueError):
    """A Hub model that cannot be had: ``reason`` says why and what to do, in one line."""

    def __init__(self, model: HubId | str, reason: str) -> None:
        self.model = str(model)
        self.reason = reason
        super().__init__(f"{self.model}: {reason}")

    def __reduce__(self) -> tuple[type[HubError], tuple[str, str]]:
        return type(self), (self.model, self.reason)


def parse_hub_id(text: str) -> HubId | None:
    """The Hub id ``text`` spells (``org/name`` or ``org/name@revision``), or None when it spells none. Only the
    syntax is read: nothing is looked up."""
    match = _HUB_ID.fullmatch(text)
    if match is None:
        return None
    repo, revision = match["repo"], match["revision"]
    if "--" in repo or ".." in repo or len(repo) > 96 or (revision and (".." in revision or revision.endswith("/"))):
        return None
    return HubId(repo, revision)


def cached_snapshot(hub: HubId) -> Path:
    """The directory of ``hub``'s snapshot in the Hugging Face cache, looked up without the network; HubError when
    it is not there, or not whole."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(hub.repo_id, revision=hub.revision, allow_patterns=list(HUB_FILES),
                                      ignore_patterns=list(NOT_FETCHED), local_files_only=True))
    except IncompleteSnapshotError:
        raise HubError(hub, f"its copy in the Hugging Face cache ({constants.HF_HUB_CACHE}) is incomplete: fetch it "
                            f"again with `forge model fetch {hub}`") from None
    except LocalEntryNotFoundError:
        raise HubError(hub, f"not in the Hugging Face cache ({constants.HF_HUB_CACHE}): fetch it first with "
                            f"`forge model fetch {hub}`") from None


def fetch_snapshot(hub: HubId, *, progress: bool = True) -> Path:
    """Download what Forge loads of ``hub`` (``HUB_FILES``) into the Hugging Face cache, files already there
    excepted, and return its snapshot's directory. Offline (``HF_HUB_OFFLINE``), or with the Hub out of reach, the
    cached snapshot serves. ``progress``: huggingface_hub's progress bars on stderr; without, it is silent. HubError
    saying why in one line when the model cannot be had."""
    import httpx2  # huggingface_hub's HTTP client: a download cut short raises its errors
    from huggingface_hub import snapshot_download

    try:
        with _shown(progress):
            path = Path(snapshot_download(hub.repo_id, revision=hub.revision, allow_patterns=list(HUB_FILES),
                                          ignore_patterns=list(NOT_FETCHED)))
    except (OSError, httpx2.HTTPError) as exc:     # the Hub's errors are OSErrors, as are the cache's
        raise HubError(hub, _reason(hub, exc)) from None
    if not (path / "config.json").is_file():
        raise HubError(hub, "it has no config.json: not a model in the Hugging Face layout")
    return path


def fetch_dataset(hub: HubId, patterns: tuple[str, ...]) -> Path:
    """The snapshot of dataset repository ``hub`` in the Hugging Face cache, with its files matching ``patterns``
    fetched when missing (the cached one serving offline), silently; HubError saying why in one line, as for a
    model."""
    import httpx2
    from huggingface_hub import snapshot_download

    try:
        with _shown(False):
            return Path(snapshot_download(hub.repo_id, repo_type="dataset", revision=hub.revision,
                                          allow_patterns=list(patterns)))
    except (OSError, httpx2.HTTPError) as exc:
        raise HubError(hub, _reason(hub, exc, "dataset")) from None


@contextmanager
def _shown(progress: bool) -> Iterator[None]:
    """huggingface_hub's progress bars and warnings as ``progress`` asks, for the time of one download."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from huggingface_hub.utils import logging as hub_logging

    if progress or are_progress_bars_disabled():
        yield
        return
    verbosity = hub_logging.get_verbosity()
    disable_progress_bars()
    hub_logging.set_verbosity_error()
    try:
        yield
    finally:
        enable_progress_bars()
        hub_logging.set_verbosity(verbosity)


def _reason(hub: HubId, exc: BaseException, what: str = "model") -> str:
    """Why ``exc`` (raised by ``snapshot_download``) kept ``hub`` (a ``what``: model or dataset) from being had, and
    what to do, in one line."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"the Hub ({constants.ENDPOINT})"
    if isinstance(exc, GatedRepoError):
        return (f"a gated {what} that the token in HF_TOKEN may not read: accept its conditions on its page on {at} "
                f"with that token's account" if _token_given() else
                f"a gated {what}: accept its conditions on its page on {at}, then set HF_TOKEN to a token of that "
                f"account")
    if isinstance(exc, RevisionNotFoundError):
        return f"{at} has no revision {hub.revision or 'main'!r} of {hub.repo_id}"
    if isinstance(exc, RepositoryNotFoundError):
        return (f"no such {what} on {at}, or a private one that the token in HF_TOKEN may not read"
                if _token_given() else
                f"no such {what} on {at} (if it is private, set HF_TOKEN to a token that may read it)")
    if isinstance(exc, LocalEntryNotFoundError):
        return _not_cached(at, exc)
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            return f"{at} refused the token in HF_TOKEN (invalid credentials)"
        return f"{at} answered HTTP {status}: {_first_line(exc)}"
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
        return f"cannot write to the Hugging Face cache ({constants.HF_HUB_CACHE}): {exc}"
    return f"the download from {at} failed: {type(exc).__name__}: {_first_line(exc)}"


def _not_cached(at: str, exc: BaseException) -> str:
    """Why a model the Hub could not give is not served from the cache either."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError, IncompleteSnapshotError, OfflineModeIsEnabled

    cache = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
    cause = exc.__cause__
    held = f"its copy in {cache} is incomplete" if isinstance(exc, IncompleteSnapshotError) else f"it is not in {cache}"
    if isinstance(cause, OfflineModeIsEnabled) or constants.is_offline_mode():
        return f"{held}, and HF_HUB_OFFLINE forbids fetching it: fetch it where the Hub can be reached, or unset " \
               f"HF_HUB_OFFLINE"
    if isinstance(cause, HfHubHTTPError) and cause.response is not None:
        return f"{at} answered HTTP {cause.response.status_code}, and {held}"
    why = f" ({type(cause).__name__})" if cause is not None else ""
    return f"{at} cannot be reached{why}, and {held}: check the network or HF_ENDPOINT"


def _token_given() -> bool:
    """Whether huggingface_hub has a token to send (HF_TOKEN, or a saved login)."""
    from huggingface_hub import get_token

    return get_token() is not None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
