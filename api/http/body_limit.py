"""Request bodies have a limit per route, enforced as they arrive: a body declared larger is refused
before any of it is read, a chunked one as soon as its bytes pass the limit, so no request makes the
API buffer more than its limit. Uploads (``POST /v1/files``) have their own, larger one. The 413 is
raised where the route reads its body, so it has the route's error shape."""

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.settings import Settings

UPLOAD_OVERHEAD = 2**20  # an upload's body beyond its file: multipart boundaries, part headers, purpose


class BodyLimit:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.request_limit = settings.max_request_bytes
        self.upload_limit = settings.max_upload_bytes + UPLOAD_OVERHEAD

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self._limit(scope)
        declared = Headers(scope=scope).get("content-length", "")
        received = 0

        async def counted() -> Message:
            nonlocal received
            if declared.isdigit() and int(declared) > limit:
                raise _too_large(limit, setting)
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise _too_large(limit, setting)
            return message

        await self.app(scope, counted, send)

    def _limit(self, scope: Scope) -> tuple[int, str]:
        if scope["method"] == "POST" and scope["path"] == "/v1/files":
            return self.upload_limit, "PAGEDQ_MAX_UPLOAD_BYTES"
        return self.request_limit, "PAGEDQ_MAX_REQUEST_BYTES"


def _too_large(limit: int, setting: str) -> HTTPException:
    return HTTPException(
        413, f"the request body is larger than this route's limit of {limit} bytes ({setting})"
    )
