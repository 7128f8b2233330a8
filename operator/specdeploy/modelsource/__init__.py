"""Where a model's architecture comes from: the spec, a config.json the operator is given, the Hugging
Face Hub, or the built-in catalog (`resolve.py` holds the order, `hub.py` the Hub client).

Exceptions, each with a condition `reason` and a message that says what, why and what to do (a token
is never part of one):

    ModelSourceError
     ├── ConfigNotUnderstood     a config.json that is not JSON, or lacks the keys the planner reads
     ├── ConfigUnreadable        a config.json path or ConfigMap key that is not there
     ├── TokenUnreadable         the token Secret a spec names is not there, or has no key `token`
     ├── HubError
     │    ├── HubAccessDenied    gated or private: no token, or the token was refused (401/403)
     │    ├── ModelNotFound      no such repository on the Hub
     │    ├── RevisionNotFound   the repository has no such branch, tag or commit
     │    └── HubUnreachable     connection refused, timeout, 429 or 5xx, after retries (transient)
     └── ModelNotResolvable      no source describes the model
"""

from __future__ import annotations


class ModelSourceError(Exception):
    """A model's architecture could not be obtained; running pods are not affected."""

    reason = "ModelSourceFailed"
    transient = False  # True: the same request may succeed later (retry with backoff, keep the last good plan)


class ConfigNotUnderstood(ModelSourceError):
    reason = "ModelConfigNotUnderstood"

    def __init__(self, message: str, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys  # the keys that were missing or unusable


class ConfigUnreadable(ModelSourceError):
    reason = "ModelConfigUnreadable"


class TokenUnreadable(ModelSourceError):
    reason = "ModelTokenUnreadable"


class HubError(ModelSourceError):
    reason = "HubRequestFailed"


class HubAccessDenied(HubError):
    reason = "ModelAccessDenied"


class ModelNotFound(HubError):
    reason = "ModelNotFound"


class RevisionNotFound(HubError):
    reason = "ModelRevisionNotFound"


class HubUnreachable(HubError):
    reason = "HubUnreachable"
    transient = True


class ModelNotResolvable(ModelSourceError):
    reason = "UnknownModel"


__all__ = [
    "ConfigNotUnderstood", "ConfigUnreadable", "HubAccessDenied", "HubError", "HubUnreachable",
    "ModelNotFound", "ModelNotResolvable", "ModelSourceError", "RevisionNotFound", "TokenUnreadable",
]
