"""config.json from the Hugging Face Hub, pinned to a commit, with the `huggingface_hub` client.

    hub = HubClient(cache_dir, token=operator_token)    # endpoint: the argument, else HF_ENDPOINT, else the Hub
    fetched = hub.fetch_config("Qwen/Qwen3-0.6B", revision="main")
    fetched.commit_sha, fetched.config["num_hidden_layers"]

The revision asked for (branch, tag or commit) is first resolved to a commit sha (`model_info`), and
the file is then downloaded at that sha, so a branch that moves between the two calls, or after the
plan, cannot change what was planned: the sha is what the record and the rendered args pin.

The cache. Fetched configs are kept on disk under `cache_dir` (the operator passes a directory of
its own, e.g. an emptyDir), one file per (model, commit sha) named `{owner}--{name}--{sha}.json`, holding
config.json's bytes as the Hub served them. A commit never changes, so a sha-keyed entry never goes
stale and a second resolution of the same sha makes no request. Beside it, `…--{sha}.base` keeps the model
the Hub's model tree says the repository quantises (its `base_model:quantized:{id}` tag, from the same
`model_info` answer), so a commit resolved from the cache pairs as it did when it was fetched. The cache is bounded by entries
(`max_cached_configs`, least recently used evicted; default 256) and each entry by size (a config.json
over 1 MiB is refused, not cached): at most 256 MiB, and in practice a few MiB, since config.json files
are kilobytes. Nothing else is kept: the client downloads into a temporary directory inside
`cache_dir` that is removed at once, so its own blob cache does not grow. A branch → sha lookup is only
remembered in memory for `revision_ttl_s` (default 5 minutes): a branch moves, and the next plan after
that must see where it points. One cache may be shared by tenants: a sha-keyed config.json, once
fetched with a token, is served from disk to a request without one (it is architecture numbers,
not weights; the engine still needs its own token to download the model).

Failures are translated at this boundary (see `specdeploy.modelsource` for the tree): 401/403 →
HubAccessDenied, missing repo → ModelNotFound, missing revision → RevisionNotFound, connection errors,
timeouts, 429 and 5xx → HubUnreachable after `retry.attempts` tries with exponential backoff. The
token goes to the client only; no message or log line built here contains it, and the client is
always told the token explicitly (`False` for none) so a token saved on the machine is never sent.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from specdeploy.modelsource import (
    ConfigUnreadable,
    HubAccessDenied,
    HubUnreachable,
    ModelNotFound,
    ModelSourceError,
    RevisionNotFound,
)
from specdeploy.modelsource.resolve import HubConfig, is_hub_repo_id, parse_config_json

__all__ = ["ConfigCache", "HubClient", "RetryPolicy", "is_commit_sha"]

DEFAULT_ENDPOINT = "https://huggingface.co"
_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """Tries for a transient failure: `attempts` in all, waiting first_delay_s, then twice that, up to max."""

    attempts: int = 3
    first_delay_s: float = 0.5
    max_delay_s: float = 4.0

    def delays(self) -> Iterator[float]:
        """The waits between tries (one fewer than the tries)."""
        delay = self.first_delay_s
        for _ in range(self.attempts - 1):
            yield delay
            delay = min(delay * 2, self.max_delay_s)


def _touch(path: Path) -> None:
    """Last use as the modification time, from the fine clock (the filesystem's own is coarse)."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))


def is_commit_sha(revision: str) -> bool:
    return bool(_COMMIT_SHA.match(revision))


class ConfigCache:
    """config.json bytes per (repo id, commit sha) in one directory, least recently used evicted."""

    def __init__(self, directory: Path, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise ValueError(f"a config cache must hold at least one entry, got max_entries={max_entries}")
        self.directory = directory
        self.max_entries = max_entries

    def _path(self, repo_id: str, sha: str) -> Path:
        return self.directory / f"{repo_id.replace('/', '--')}--{sha}.json"

    def entries(self) -> list[Path]:
        return sorted(self.directory.glob("*--*.json"))

    def _base_path(self, repo_id: str, sha: str) -> Path:
        return self.directory / f"{repo_id.replace('/', '--')}--{sha}.base"

    def base_model(self, repo_id: str, sha: str) -> str:
        """The base model recorded with the commit's config.json ("" when the Hub named none)."""
        try:
            return self._base_path(repo_id, sha).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return ""

    def get(self, repo_id: str, sha: str) -> bytes | None:
        path = self._path(repo_id, sha)
        try:
            content = path.read_bytes()
            _touch(path)  # a hit makes the entry the most recently used
        except FileNotFoundError:
            return None
        return content

    def put(self, repo_id: str, sha: str, content: bytes, base_model: str = "") -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if base_model:   # written first: a config.json on disk always has its record beside it
            self._base_path(repo_id, sha).write_text(base_model, encoding="utf-8")
        path = self._path(repo_id, sha)
        with tempfile.NamedTemporaryFile(dir=self.directory, prefix=".put-", delete=False) as partial:
            partial.write(content)
        os.replace(partial.name, path)  # readers see the whole file or none of it
        _touch(path)
        self._evict()

    def _evict(self) -> None:
        def last_used(path: Path) -> float:
            try:
                return path.stat().st_mtime_ns
            except FileNotFoundError:
                return 0
        entries = sorted(self.entries(), key=last_used)
        for stale in entries[: max(0, len(entries) - self.max_entries)]:
            stale.unlink(missing_ok=True)
            stale.with_suffix(".base").unlink(missing_ok=True)


_QUANTISED_FROM = "base_model:quantized:"


def quantised_from(tags: Iterable[str]) -> str:
    """The model a repository quantises, from the tag the Hub's model tree derives from its card's `base_model`
    and the relation (`base_model:quantized:meta-llama/Llama-3.3-70B-Instruct`); "" for none or several. A
    fine-tune (`base_model:finetune:…`) holds other weights and is not the base's."""
    bases = {tag[len(_QUANTISED_FROM):] for tag in tags if tag.startswith(_QUANTISED_FROM)}
    return bases.pop() if len(bases) == 1 else ""


@dataclass(frozen=True)
class _Commit:
    sha: str
    base_model: str    # quantised_from the repository's tags at that commit ("" when none)


DOWN_SECONDS = 30.0
"""How long a Hub that did not answer through every retry is taken for down."""


class HubClient:
    """Fetches config.json at a commit, through the on-disk cache; one per operator (thread-safe)."""

    def __init__(
        self,
        cache_dir: Path,
        *,
        endpoint: str | None = None,
        token: str | None = None,
        max_cached_configs: int = 256,
        revision_ttl_s: float = 300.0,
        timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        self.cache = ConfigCache(cache_dir, max_cached_configs)
        self.revision_ttl_s = revision_ttl_s
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy()
        self._token = token
        self._clock = clock
        self._sleep = sleep
        self._api = HfApi(endpoint=self.endpoint)
        self._revisions: dict[tuple[str, str], tuple[_Commit, float]] = {}
        self._lock = threading.Lock()
        self._down: tuple[float, str] | None = None   # until when the Hub counts as down, and why

    def fetch_config(self, repo_id: str, revision: str = "main", token: str | None = None) -> HubConfig:
        """config.json of `repo_id` at the commit `revision` names now; `token` overrides the client's."""
        if not is_hub_repo_id(repo_id):
            raise ModelNotFound(f"{repo_id!r} is not a Hugging Face repository id (owner/name), so the Hub is "
                                "not asked for it; give config.json through a ConfigMap or a path instead")
        credential: str | bool = token or self._token or False
        commit = self._commit_for(repo_id, revision, credential)
        sha = commit.sha
        cached = self.cache.get(repo_id, sha)
        content = cached or self._with_retries(lambda: self._download(repo_id, sha, credential), repo_id, revision)
        config = parse_config_json(content, f"config.json of {repo_id} at commit {sha}")
        if cached is None:
            self.cache.put(repo_id, sha, content, commit.base_model)  # only a config that parses is kept
        return HubConfig(repo_id, revision, sha, config, self.endpoint, commit.base_model)

    def _commit_for(self, repo_id: str, revision: str, credential: str | bool) -> _Commit:
        if is_commit_sha(revision) and self.cache.get(repo_id, revision) is not None:
            return _Commit(revision, self.cache.base_model(repo_id, revision))
        key = (repo_id, revision)
        now = self._clock()
        with self._lock:
            remembered = self._revisions.get(key)
        if remembered is not None and now < remembered[1]:
            return remembered[0]
        commit = self._with_retries(lambda: self._model_commit(repo_id, revision, credential), repo_id, revision)
        if not is_commit_sha(revision):
            with self._lock:
                self._revisions[key] = (commit, now + self.revision_ttl_s)
        return commit

    def _model_commit(self, repo_id: str, revision: str, credential: str | bool) -> _Commit:
        info = self._api.model_info(repo_id, revision=revision, token=credential, timeout=self.timeout_s)
        if not info.sha or not is_commit_sha(info.sha):
            raise HubUnreachable(f"the Hub at {self.endpoint} answered for {repo_id}@{revision} without a commit "
                                 "sha, so it does not look like a Hugging Face Hub; check HF_ENDPOINT")
        return _Commit(info.sha, quantised_from(info.tags or ()))

    def _download(self, repo_id: str, sha: str, credential: str | bool) -> bytes:
        self.cache.directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.cache.directory, prefix=".download-") as scratch:
            path = hf_hub_download(
                repo_id, "config.json", revision=sha, endpoint=self.endpoint, token=credential,
                cache_dir=scratch, etag_timeout=self.timeout_s,
            )
            return Path(str(path)).read_bytes()

    def _with_retries(self, call: Callable[[], Any], repo_id: str, revision: str) -> Any:
        """`call` with retries and backoff on transient errors. A Hub that stayed unreachable through every
        retry counts as down for DOWN_SECONDS: requests meanwhile fail at once instead of each waiting out
        its own retries (an operator of a thousand SDs must not fill its threads with sleeps)."""
        with self._lock:
            down = self._down
        if down is not None and self._clock() < down[0]:
            raise HubUnreachable(f"{down[1]} (asked again {DOWN_SECONDS:.0f} s after that, not before)")
        delays = self.retry.delays()
        attempt = 1
        while True:
            try:
                result = call()
                with self._lock:
                    self._down = None
                return result
            except ModelSourceError:
                raise
            except Exception as exc:  # the client's, translated here and nowhere else
                error = self._translate(exc, repo_id, revision, attempt)
                delay = next(delays, None) if error.transient else None
                if delay is None:
                    if error.transient:
                        with self._lock:
                            self._down = (self._clock() + DOWN_SECONDS, str(error))
                    raise error from exc
            self._sleep(delay)
            attempt += 1

    def _translate(self, exc: Exception, repo_id: str, revision: str, attempt: int) -> ModelSourceError:
        hub, at = f"the Hub at {self.endpoint}", f"{repo_id}@{revision}"
        status = exc.response.status_code if isinstance(exc, HfHubHTTPError) and exc.response is not None else None
        if isinstance(exc, GatedRepoError) or status in (401, 403):
            if status == 401:
                return HubAccessDenied(
                    f"{repo_id} is gated or private on {hub} (HTTP 401): its files are served only with the "
                    "token of an account that has accepted the model's licence or may read it, and no token was "
                    "accepted; accept the licence on the model page and give specdeploy that account's token (a "
                    "Secret named by the model's `tokenSecretRef`; HF_TOKEN for `specdeploy plan`), or give "
                    "config.json through a ConfigMap"
                )
            return HubAccessDenied(
                f"{hub} refused the token for {repo_id} (HTTP {status}): the account it belongs to has not been "
                "granted access to this gated or private model; request access on the model page, or use the "
                "token of an account that has it"
            )
        if isinstance(exc, RevisionNotFoundError):
            return RevisionNotFound(
                f"{repo_id} has no revision {revision!r} on {hub}: use a branch, tag or full commit sha that "
                "exists in the repository (the default is main)"
            )
        if isinstance(exc, RemoteEntryNotFoundError):
            return ConfigUnreadable(
                f"{at} on {hub} has no config.json (a repository of GGUF or other files only?), so its "
                "architecture cannot be read; describe the model with an `architecture` in the spec"
            )
        if isinstance(exc, RepositoryNotFoundError):
            return ModelNotFound(
                f"there is no model {repo_id!r} on {hub}: check the owner/name spelling, or, for a private "
                "repository, give a token that may read it"
            )
        transient = (
            isinstance(exc, httpx2.TransportError | OfflineModeIsEnabled | LocalEntryNotFoundError | TimeoutError)
            or status in _TRANSIENT_STATUS
        )
        if transient:
            cause = f"HTTP {status}" if status is not None else exc.__class__.__name__
            return HubUnreachable(
                f"{hub} could not be reached for {at} after {attempt} attempt{'s' * (attempt > 1)} ({cause}); "
                "specdeploy retries with backoff and the last good plan stands meanwhile; check the operator's "
                "network path to the Hub (or HF_ENDPOINT for a mirror), or give config.json through a ConfigMap"
            )
        cause = f"HTTP {status}" if status is not None else exc.__class__.__name__
        return ModelSourceError(f"{hub} failed for {at} ({cause}); give config.json through a ConfigMap, or "
                                "an `architecture` in the spec")
