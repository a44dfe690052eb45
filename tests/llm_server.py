"""A scriptable fake LLM server for tests: speaks the OpenAI and the Anthropic wire protocols over real HTTP.

Tests point the official SDKs at it (OpenAI: ``server.openai_base_url``, i.e. ``http://127.0.0.1:PORT/v1``;
Anthropic: ``server.url``), queue behaviours per path, and afterwards inspect ``server.received(path)``: the
headers and JSON body of every request that arrived, retries included.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"

# error "type" per status, in each protocol's own vocabulary
_OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
                       404: "invalid_request_error", 429: "requests", 500: "server_error"}
_ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                          404: "not_found_error", 429: "rate_limit_error", 500: "api_error",
                          529: "overloaded_error"}


@dataclass(frozen=True)
class Behaviour:
    """What the server does with one request."""

    status: int = 200
    text: str | None = "ok"  # None: OpenAI null content / Anthropic no text block
    truncated: bool = False  # finish_reason "length" / stop_reason "max_tokens"
    delay_s: float = 0.0  # sleep before answering (to trip the client's timeout)
    headers: tuple[tuple[str, str], ...] = ()
    input_tokens: int = 11
    output_tokens: int = 7
    message: str = ""  # error message for error statuses
    no_choices: bool = False  # OpenAI: an empty choices list
    thinking: str | None = None  # Anthropic: a thinking block before the text
    raw_body: str | None = None  # sent as is, with content-type application/json (e.g. a proxy's HTML page)


def ok(text: str = "ok", **kw: Any) -> Behaviour:
    return Behaviour(text=text, **kw)


def error(status: int, message: str = "", retry_after_ms: int | None = 1) -> Behaviour:
    """An error reply. ``retry-after-ms`` keeps the SDKs' retry sleeps short (both SDKs honour it)."""
    headers = (("retry-after-ms", str(retry_after_ms)), ("retry-after", "0")) if retry_after_ms else ()
    return Behaviour(status=status, message=message or f"fake error {status}", headers=headers)


def rate_limited(retry_after_ms: int = 1) -> Behaviour:
    return error(429, "Rate limit reached, slow down", retry_after_ms)


def server_error() -> Behaviour:
    return error(500, "The server had an error while processing your request")


def overloaded() -> Behaviour:
    return error(529, "Overloaded")


def unauthorized() -> Behaviour:
    return error(401, "Incorrect API key provided", retry_after_ms=None)


def not_json(status: int = 200) -> Behaviour:
    """A body that is not JSON although it says so (a proxy's error page, a cut stream)."""
    return Behaviour(status=status, raw_body="<html><body>502 Bad Gateway</body></html>")


def slow(delay_s: float, text: str = "late") -> Behaviour:
    return Behaviour(text=text, delay_s=delay_s)


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # names lower-cased
    body: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


class FakeLLMServer:
    """ThreadingHTTPServer on 127.0.0.1, port chosen by the OS. Use as a context manager."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[str, deque[Behaviour]] = {}
        self._fallback: dict[str, Behaviour] = {}
        self._received: list[Received] = []
        self._stop = threading.Event()
        self._counter = 0
        self._models: Behaviour | None = None  # GET /v1/models/<id> (None: 501, a server without it)
        self._gets: list[tuple[str, dict[str, str]]] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-llm", daemon=True)

    # --- lifecycle ----------------------------------------------------------------------------------------
    def __enter__(self) -> FakeLLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()  # wakes handlers sleeping in a slow behaviour
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    # --- scripting ----------------------------------------------------------------------------------------
    def script(self, path: str, *behaviours: Behaviour) -> None:
        """Queue behaviours for ``path``, served one per request in order."""
        with self._lock:
            self._queues.setdefault(path, deque()).extend(behaviours)

    def fallback(self, path: str, behaviour: Behaviour) -> None:
        """What ``path`` does once its queue is empty (default: ``ok("ok")``)."""
        with self._lock:
            self._fallback[path] = behaviour

    def models(self, behaviour: Behaviour) -> None:
        """What ``GET /v1/models/<id>`` answers from now on (a provider check); unset: 501."""
        with self._lock:
            self._models = behaviour

    def model_checks(self) -> list[tuple[str, dict[str, str]]]:
        """The GETs of the models endpoint that arrived: (path, headers)."""
        with self._lock:
            return list(self._gets)

    def _model_behaviour(self, path: str, headers: dict[str, str]) -> Behaviour | None:
        with self._lock:
            self._gets.append((path, headers))
            return self._models

    def received(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self._received if path is None or r.path == path]

    # --- used by the handler ------------------------------------------------------------------------------
    def _next(self, req: Received) -> tuple[Behaviour, int]:
        with self._lock:
            self._received.append(req)
            self._counter += 1
            queue = self._queues.get(req.path)
            behaviour = queue.popleft() if queue else self._fallback.get(req.path, Behaviour())
            return behaviour, self._counter


def _openai_body(b: Behaviour, model: str, n: int) -> dict[str, Any]:
    if b.status != 200:
        code = "invalid_api_key" if b.status == 401 else None
        return {"error": {"message": b.message, "type": _OPENAI_ERROR_TYPES.get(b.status, "error"),
                          "param": None, "code": code}}
    choices = [] if b.no_choices else [{
        "index": 0,
        "message": {"role": "assistant", "content": b.text},
        "finish_reason": "length" if b.truncated else "stop",
    }]
    usage = {"prompt_tokens": b.input_tokens, "completion_tokens": b.output_tokens,
             "total_tokens": b.input_tokens + b.output_tokens}
    return {"id": f"chatcmpl-fake{n}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": usage}


def _anthropic_body(b: Behaviour, model: str, n: int) -> dict[str, Any]:
    if b.status != 200:
        return {"type": "error", "error": {"type": _ANTHROPIC_ERROR_TYPES.get(b.status, "api_error"),
                                           "message": b.message}}
    content: list[dict[str, Any]] = []
    if b.thinking is not None:
        content.append({"type": "thinking", "thinking": b.thinking, "signature": "fake-signature"})
    if b.text is not None:
        content.append({"type": "text", "text": b.text})
    return {"id": f"msg_fake{n}", "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": "max_tokens" if b.truncated else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": b.input_tokens, "output_tokens": b.output_tokens}}


def _make_handler(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like real API servers

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"_unparsed": raw.decode("utf-8", "replace")}
            req = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            behaviour, n = server._next(req)
            if behaviour.delay_s and server._stop.wait(behaviour.delay_s):
                self.close_connection = True
                return
            model = str(body.get("model", "fake-model"))
            if self.path == OPENAI_PATH:
                payload = _openai_body(behaviour, model, n)
            elif self.path == ANTHROPIC_PATH:
                payload = _anthropic_body(behaviour, model, n)
            else:
                behaviour = Behaviour(status=404, message=f"no route {self.path}")
                payload = _openai_body(behaviour, model, n)
            self._send(behaviour, payload)

        def do_GET(self) -> None:
            """The models endpoint (``/v1/models/<id>``, both protocols), as :meth:`FakeLLMServer.models` scripts
            it; unscripted, 501 as before (a server without it). Kept apart from ``received``."""
            model = self.path.rsplit("/", 1)[-1]
            behaviour = server._model_behaviour(self.path, {k.lower(): v for k, v in self.headers.items()})
            if behaviour is None or not self.path.startswith("/v1/models/"):
                self._send(Behaviour(status=501, message="no GET here"), _openai_body(
                    Behaviour(status=501, message="no GET here"), model, 0))
                return
            if behaviour.status == 200:
                self._send(behaviour, {"id": model, "object": "model", "type": "model", "created": 0,
                                       "created_at": "2026-01-01T00:00:00Z", "owned_by": "fake",
                                       "display_name": model})
            else:
                self._send(behaviour, _openai_body(behaviour, model, 0))

        def _send(self, behaviour: Behaviour, payload: dict[str, Any]) -> None:
            data = (behaviour.raw_body if behaviour.raw_body is not None else json.dumps(payload)).encode()
            try:
                self.send_response(behaviour.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in behaviour.headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                self.close_connection = True

    return Handler
