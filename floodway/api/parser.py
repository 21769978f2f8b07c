"""Requests the HTTP parser refuses (a header value holding a control character, a malformed
request line) are answered as every other error of the API: a problem document (with
OpenAI's error object under ``/openai/v1``), not uvicorn's ``text/plain`` 400.

No route runs for such a request, so uvicorn's own answer is replaced in its HTTP protocol
(httptools', which ``uvicorn[standard]`` installs and uvicorn picks by default).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from floodway.api.problems import PROBLEM_JSON, problem_bytes

DETAIL = (
    "the request is not valid HTTP/1.1: a header value holds a control character or another "
    "byte HTTP does not allow (an Idempotency-Key, say), or the request line is malformed"
)


class ProblemHttpProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        # The path, when the parser got as far as the request line (the URL comes first).
        path = urlsplit(bytes(getattr(self, "url", b"")).decode("latin-1")).path or None
        body = problem_bytes(400, "malformed-request", DETAIL, instance=path)
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(b"content-type: " + PROBLEM_JSON.encode() + b"\r\n")
        head.append(b"content-length: " + str(len(body)).encode() + b"\r\n")
        head.append(b"connection: close\r\n\r\n")
        self.transport.write(b"".join(head) + body)
        self.transport.close()
