"""What the API's query modules report when a request cannot be done, in the service's terms.

They know nothing of HTTP: ``api/http/errors.py`` turns each kind into its status and body, once, for every
route (``{"detail": ...}``, plus OpenAI's ``{"error": ...}`` on OpenAI's routes).
"""


class Problem(Exception):
    """Its message says what is wrong in the client's terms."""


class NotFound(Problem):
    """No such job, batch or file (404)."""

    def __init__(self, kind: str, key: str) -> None:
        super().__init__(f"{kind} {key!r} not found")


class UnknownModel(Problem):
    """A model this service does not serve (404, OpenAI's ``model_not_found``); names the served ones."""

    code = "model_not_found"

    def __init__(self, name: str, served: list[str]) -> None:
        super().__init__(f"model {name!r} is not served here; served: {', '.join(served)}")


class WrongKind(Problem):
    """A served model asked for what its kind does not do (400): chat of an embedding model."""

    code = "model_kind_mismatch"


class Conflict(Problem):
    """The request is valid, but the object's state does not allow it now (409)."""


class Unavailable(Problem):
    """Something the service needs is briefly away; the client should retry (503 with Retry-After)."""


class Invalid(Problem):
    """Input only the service can judge (context length, a webhook host, a file's purpose): a 422 that
    names where, shaped like the request validator's own."""

    def __init__(self, loc: tuple[str, ...], message: str, kind: str) -> None:
        super().__init__(message)
        self.loc, self.kind = loc, kind

    def errors(self) -> list[dict[str, object]]:
        return [{"type": self.kind, "loc": self.loc, "msg": str(self)}]


class Unauthenticated(Problem):
    """No key, or one that is not a key of this service (401, with ``WWW-Authenticate: Bearer``)."""


class Forbidden(Problem):
    """The caller may not do this (403): a revoked or expired key, a user key on an operator's route, or a
    state change sent from another site."""


class TooMany(Problem):
    """A key's limit is reached (429); ``headers`` say when to retry (``Retry-After``, ``x-ratelimit-*``)."""

    def __init__(self, message: str, headers: dict[str, str]) -> None:
        super().__init__(message)
        self.headers = headers
