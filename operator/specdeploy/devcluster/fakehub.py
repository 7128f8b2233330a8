"""A local stand-in for the Hugging Face Hub, on loopback, for the real `huggingface_hub` client.

    with FakeHub.from_fixtures(Path("tests/fixtures/hub"), access_tokens={"hf_test"}) as hub:
        HfApi(endpoint=hub.url).model_info("Qwen/Qwen3-0.6B", revision="main").sha
        sha = hub.commit("Qwen/Qwen3-0.6B", {"config.json": b"{...}"})   # moves `main` to a new commit
        hub.stop()                                                      # an outage, mid-run

It answers what the client asks for a model's info and for one file at a revision (read in
huggingface_hub 2.4.0: `HfApi.model_info`, `get_hf_file_metadata`, `http_get`, `hf_raise_for_status`):

    GET  /api/models/{repo_id}[/revision/{revision}]    {"id", "sha", "gated", "private", "siblings", "tags"}
    HEAD /{repo_id}/resolve/{revision}/{filename}        X-Repo-Commit, ETag, Content-Length
    GET  /{repo_id}/resolve/{revision}/{filename}        the same headers and the file

Errors carry the Hub's `X-Error-Code` header, from which the client picks its exception: RepoNotFound
(404, RepositoryNotFoundError), RevisionNotFound (404, RevisionNotFoundError), EntryNotFound (404),
GatedRepo (401 without a token, 403 with a token not on the repo's list; GatedRepoError). Like the
Hub, a gated repo's info is public and only its files need the token. `outage_status` makes every
answer that status (a 503 is a Hub that is up but failing). Revisions are branch or tag names, or
full commit shas. The fixture directory holds `index.json` ({"repos": {repo_id: {"gated": bool, "tags": [...]}}}:
the tags as the Hub lists them, e.g. its model tree's `base_model:quantized:{id}`) and
`{repo_id}/config.json`; each repo starts with one commit on `main`, whose sha is derived from its files.
Requests are recorded (method, path, whether a token came), never the token itself.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["FakeHub", "FakeRepo", "RecordedRequest", "commit_sha"]

_SHA_LENGTH = 40


def commit_sha(repo_id: str, files: Mapping[str, bytes], parent: str = "") -> str:
    """A 40-hex commit id derived from a commit's content, the shape the client checks revisions against."""
    digest = hashlib.sha1(f"{repo_id}\0{parent}".encode(), usedforsecurity=False)
    for name in sorted(files):
        digest.update(f"\0{name}\0".encode() + files[name])
    return digest.hexdigest()


@dataclass
class FakeRepo:
    """One repository: commits (sha → files) and refs (branch or tag → sha)."""

    repo_id: str
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    tags: tuple[str, ...] = ()

    @classmethod
    def with_files(cls, repo_id: str, files: Mapping[str, bytes], gated: bool = False,
                   tags: Iterable[str] = ()) -> FakeRepo:
        sha = commit_sha(repo_id, files)
        return cls(repo_id, commits={sha: dict(files)}, refs={"main": sha}, gated=gated, tags=tuple(tags))

    def sha_of(self, revision: str) -> str | None:
        if revision in self.refs:
            return self.refs[revision]
        return revision if len(revision) == _SHA_LENGTH and revision in self.commits else None


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    with_token: bool


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: dict[str, str]
    body: bytes = b""


def _error(status: int, code: str | None, message: str, extra: Mapping[str, str] | None = None) -> _Answer:
    headers = {"Content-Type": "application/json", "X-Error-Message": message, **(extra or {})}
    if code is not None:
        headers["X-Error-Code"] = code
    return _Answer(status, headers, json.dumps({"error": message}).encode())


class FakeHub:
    """The fake Hub's state and its HTTP server; a context manager that starts and stops it."""

    def __init__(self, repos: Iterable[FakeRepo] = (), access_tokens: Iterable[str] = ()) -> None:
        self._repos = {repo.repo_id: repo for repo in repos}
        self._tokens = frozenset(access_tokens)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self.requests: list[RecordedRequest] = []
        self.outage_status: int | None = None

    @classmethod
    def from_fixtures(cls, root: Path, access_tokens: Iterable[str] = ()) -> FakeHub:
        """Every repo in `root/index.json`, with its `config.json` as the one file of its first commit."""
        index = json.loads((root / "index.json").read_text(encoding="utf-8"))
        repos = [
            FakeRepo.with_files(repo_id, {"config.json": (root / repo_id / "config.json").read_bytes()},
                                gated=bool(entry.get("gated", False)), tags=entry.get("tags", ()))
            for repo_id, entry in index["repos"].items()
        ]
        return cls(repos, access_tokens)

    # --- state ------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The endpoint to give the client (`HF_ENDPOINT`, or `endpoint=`); it stays the same across a stop."""
        if not self._port:
            raise RuntimeError("the fake hub has not been started: call start() or use it as a context manager")
        return f"http://127.0.0.1:{self._port}"

    def sha(self, repo_id: str, revision: str = "main") -> str:
        with self._lock:
            sha = self._repos[repo_id].sha_of(revision)
        if sha is None:
            raise KeyError(f"{repo_id} has no revision {revision!r}")
        return sha

    def commit(self, repo_id: str, files: Mapping[str, bytes], branch: str = "main") -> str:
        """A new commit on `branch` (created if new) with `files` replacing those of the same name."""
        with self._lock:
            repo = self._repos[repo_id]
            parent = repo.refs.get(branch, "")
            merged = {**repo.commits.get(parent, {}), **files}
            sha = commit_sha(repo_id, merged, parent)
            repo.commits[sha] = merged
            repo.refs[branch] = sha
        return sha

    def move_ref(self, repo_id: str, ref: str, sha: str) -> None:
        with self._lock:
            repo = self._repos[repo_id]
            if sha not in repo.commits:
                raise KeyError(f"{repo_id} has no commit {sha}")
            repo.refs[ref] = sha

    def requests_for(self, path_part: str) -> list[RecordedRequest]:
        with self._lock:
            return [request for request in self.requests if path_part in request.path]

    # --- answers (pure over the state) -------------------------------------------------------------

    def answer(self, method: str, raw_path: str, authorization: str | None) -> _Answer:
        """What the Hub would answer to `method raw_path` with this Authorization header."""
        token = authorization[len("Bearer "):] if authorization and authorization.startswith("Bearer ") else None
        path = urlsplit(raw_path).path
        with self._lock:
            self.requests.append(RecordedRequest(method, path, token is not None))
            if self.outage_status is not None:
                return _error(self.outage_status, None, "the Hub is failing (fake outage)")
            if path.startswith("/api/models/"):
                return self._model_info(path[len("/api/models/"):])
            if "/resolve/" in path:
                return self._resolve(method, path, token)
        return _error(404, None, f"no route for {path}")

    def _model_info(self, rest: str) -> _Answer:
        repo_id, _, revision = rest.partition("/revision/")
        repo_id, revision = unquote(repo_id), unquote(revision) or "main"
        repo = self._repos.get(repo_id)
        if repo is None:
            return _error(404, "RepoNotFound", f"Repository {repo_id} not found")
        sha = repo.sha_of(revision)
        if sha is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        body = {
            "id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
            "gated": "manual" if repo.gated else False,
            "siblings": [{"rfilename": name} for name in sorted(repo.commits[sha])],
            "tags": list(repo.tags),
        }
        return _Answer(200, {"Content-Type": "application/json"}, json.dumps(body).encode())

    def _resolve(self, method: str, path: str, token: str | None) -> _Answer:
        repo_part, _, rest = path.lstrip("/").partition("/resolve/")
        revision, _, filename = rest.partition("/")
        repo_id, revision, filename = unquote(repo_part), unquote(revision), unquote(filename)
        repo = self._repos.get(repo_id)
        if repo is None:
            return _error(404, "RepoNotFound", f"Repository Not Found for url: {path}.")
        sha = repo.sha_of(revision)
        if sha is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if repo.gated and token is None:
            return _error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to "
                          "it and be authenticated to access it. Please log in.")
        if repo.gated and token not in self._tokens:
            return _error(403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the "
                          "authorized list. Visit its page to ask for access.")
        content = repo.commits[sha].get(filename)
        if content is None:
            return _error(404, "EntryNotFound", f"{filename} does not exist on {revision}", {"X-Repo-Commit": sha})
        headers = {
            "Content-Type": "application/octet-stream", "Content-Length": str(len(content)),
            "X-Repo-Commit": sha, "ETag": f'"{hashlib.sha256(content).hexdigest()}"',
        }
        return _Answer(200, headers, b"" if method == "HEAD" else content)

    # --- server -------------------------------------------------------------------------------------

    def start(self) -> FakeHub:
        """Serve on 127.0.0.1 (a free port the first time, the same port after a stop)."""
        if self._server is not None:
            return self
        hub = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.0: one request per connection, so a stopped hub has no kept-alive connection still answering.

            def _reply(self) -> None:
                answer = hub.answer(self.command, self.path, self.headers.get("Authorization"))
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                if "Content-Length" not in answer.headers:
                    self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer.body)

            do_GET = do_HEAD = _reply

            def log_message(self, format: str, *args: Any) -> None:
                return  # the test output is not the place for an access log

        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._server.daemon_threads = True
        self._port = self._server.server_address[1]
        # A short poll keeps stop() quick: shutdown() waits for the serving loop's next poll.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), name="fakehub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering: the port refuses connections until start() is called again."""
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
