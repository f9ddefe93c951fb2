"""A local OpenAI-compatible chat-completions server for tests: scripted answers, counted requests.

It runs in a thread of the test process, so a script can be any Python function, and listens on
a free loopback port, so worker processes reach it over HTTP exactly as they would a real model
server (`AGENTFLOW_LLM_BASE_URL=server.url`). The server keeps the count: the test reads it from
the object, any other process from `GET /_llm/requests` (`requests_seen(url)`).

    def test_turns(llm_server):
        llm_server.script([tool_calls(("fetch_booking", {"booking_reference": "ABC123"})),
                           reply("All done.")])                  # answers by turn number
        llm_server.fail_next(fail(429, retry_after=2))           # faults on demand, first
        ...
        assert llm_server.count(turn=1) == 2

A script is a list of answers indexed by turn (1 + the assistant messages already in the
conversation, so a retried or replayed turn gets the same answer), a dict {turn: answer}, or a
function of the request. A plan (`plan(...)`) is a list whose turns may also be functions of the
request: what a hostile model does, turn by turn, with ids it read from the conversation.
It serves `POST /v1/chat/completions` (non-streaming, tool calls, usage) and answers 400 to a
conversation a real server would refuse (a tool call left without its result), so a loop that
builds bad conversations fails here too.
"""

from __future__ import annotations

import json
import math
import threading
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

#: The first `created` timestamp; answers are numbered from it so they are reproducible.
_CREATED = 1_700_000_000


@dataclass(frozen=True, kw_only=True)
class SeenRequest:
    """One request the server received, in arrival order."""

    number: int
    turn: int
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body.get("messages", [])

    @property
    def tool_names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.body.get("tools", [])]

    def as_json(self) -> dict[str, Any]:
        return {"number": self.number, "turn": self.turn, "body": self.body}


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What the server does with one request."""

    status: int = 200
    content: str | None = None
    #: (name, arguments): a dict is sent as JSON text, a string as it is (to send broken JSON).
    tool_calls: tuple[tuple[str, dict[str, Any] | str], ...] = ()
    error: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Hold the request this long (or until the server stops), then close without answering.
    stall_seconds: float = 0.0
    finish_reason: str | None = None


def reply(text: str, *, finish_reason: str = "stop") -> Answer:
    return Answer(content=text, finish_reason=finish_reason)


def tool_calls(*calls: tuple[str, dict[str, Any] | str], content: str | None = None) -> Answer:
    return Answer(content=content, tool_calls=calls)


def fail(status: int, message: str = "", *, retry_after: str | float | None = None) -> Answer:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return Answer(status=status, error=message or f"scripted HTTP {status}", headers=headers)


def stall(seconds: float) -> Answer:
    """Answer nothing for `seconds`: the client's timeout fires first."""
    return Answer(stall_seconds=seconds)


Script = Callable[[SeenRequest], Answer] | Sequence[Answer] | Mapping[int, Answer]


class LLMServer:
    """The server and its controls; see the module docstring."""

    def __init__(self, script: Script | None = None) -> None:
        self._lock = threading.Lock()
        self._script: Script = script if script is not None else []
        self._faults: list[Answer] = []
        self._requests: list[SeenRequest] = []
        self._billed: list[dict[str, Any]] = []
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    # --- controls -------------------------------------------------------------------------------
    def start(self) -> LLMServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # releases stalled requests
        self._httpd.shutdown()
        self._httpd.server_close()

    def script(self, script: Script) -> None:
        """Replace the script (e.g. to answer a turn differently after a crash)."""
        with self._lock:
            self._script = script

    def fail_next(self, *answers: Answer) -> None:
        """Serve these, one per request in order, before going back to the script."""
        with self._lock:
            self._faults.extend(answers)

    @property
    def requests(self) -> list[SeenRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def billed(self) -> list[dict[str, Any]]:
        """The usage of every answer the server sent (a provider bills each one, whether the
        client recorded it or died before it could), with the model it answered for."""
        with self._lock:
            return list(self._billed)

    def _bill(self, body: dict[str, Any]) -> None:
        with self._lock:
            self._billed.append({**body["usage"], "model": body["model"]})

    def count(self, *, turn: int | None = None) -> int:
        """Requests received (for one turn, if given), faults and refusals included."""
        return sum(1 for seen in self.requests if turn is None or seen.turn == turn)

    # --- serving --------------------------------------------------------------------------------
    def _answer_for(self, seen: SeenRequest) -> Answer:
        with self._lock:
            if self._faults:
                return self._faults.pop(0)
            script = self._script
        if callable(script):
            return script(seen)
        if isinstance(script, Mapping):
            found = script.get(seen.turn)
        else:
            found = script[seen.turn - 1] if 0 < seen.turn <= len(script) else None
        if found is None:
            return fail(400, f"the test's script has no answer for turn {seen.turn}")
        return found

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> SeenRequest:
        messages = body.get("messages")
        said = messages if isinstance(messages, list) else []
        turn = 1 + sum(isinstance(m, dict) and m.get("role") == "assistant" for m in said)
        with self._lock:
            seen = SeenRequest(
                number=len(self._requests) + 1, turn=turn, body=body, headers=headers
            )
            self._requests.append(seen)
        return seen


def completion_body(seen: SeenRequest, answer: Answer) -> dict[str, Any]:
    """A chat.completion object as OpenAI sends it, with deterministic ids and usage."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_{seen.turn}_{index}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
            for index, (name, arguments) in enumerate(answer.tool_calls, start=1)
        ]
    prompt = math.ceil(len(json.dumps(seen.messages)) / 4)
    completion = math.ceil(len(json.dumps(message)) / 4)
    return {
        "id": f"chatcmpl-{seen.number}",
        "object": "chat.completion",
        "created": _CREATED + seen.number,
        "model": seen.body.get("model", ""),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": answer.finish_reason
                or ("tool_calls" if answer.tool_calls else "stop"),
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def conversation_problem(body: Any) -> str | None:
    """Why a real server would refuse this request with a 400, or None."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "'model' is required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    for tool in body.get("tools", []):
        if tool.get("type") != "function" or not tool.get("function", {}).get("name"):
            return "every tool must be {'type': 'function', 'function': {'name': ...}}"
    pending: set[str] = set()
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return f"messages[{index}] has no valid role"
        if role == "tool":
            if message.get("tool_call_id") not in pending:
                return f"messages[{index}] answers no pending tool call"
            pending.discard(message["tool_call_id"])
            continue
        if pending:
            return (
                "an assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id' (missing: {', '.join(sorted(pending))})"
            )
        if role == "assistant":
            pending = {call["id"] for call in message.get("tool_calls") or ()}
    return None


def _handler_for(server: LLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            return None

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/_llm/requests":
                self._send(404, {"error": {"message": "not found"}})
                return
            seen = server.requests
            self._send(200, {"count": len(seen), "requests": [s.as_json() for s in seen]})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no endpoint {self.path}"}})
                return
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode(errors="replace")
            seen = server._record(
                body if isinstance(body, dict) else {"raw": body},
                {key.lower(): value for key, value in self.headers.items()},
            )
            problem = conversation_problem(body)
            if problem:
                self._send(400, _error(problem, "invalid_request_error"))
                return
            answer = server._answer_for(seen)
            if answer.stall_seconds:
                server._stopping.wait(answer.stall_seconds)
                self.close_connection = True
                return
            if answer.status != 200:
                kind = {429: "rate_limit_error"}.get(
                    answer.status,
                    "server_error" if answer.status >= 500 else "invalid_request_error",
                )
                self._send(answer.status, _error(answer.error, kind), answer.headers)
                return
            body = completion_body(seen, answer)
            server._bill(body)
            self._send(200, body, answer.headers)

        def _send(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                # One request per connection: a kept-alive socket would hold a server thread
                # (named like the browser tests' live server's) past the test that used it.
                self.send_header("Connection", "close")
                self.close_connection = True
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timed out, or its worker was killed)

    return Handler


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def requests_seen(url: str) -> list[dict[str, Any]]:
    """The server's request log, read over HTTP (from any process); `url` is `server.url`."""
    base = url.removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/_llm/requests", timeout=10) as response:
        return json.loads(response.read())["requests"]


@pytest.fixture
def llm_server() -> Iterator[LLMServer]:
    """A fresh server for one test (empty script: every turn answers 400 until scripted)."""
    server = LLMServer().start()
    try:
        yield server
    finally:
        server.stop()


Turn = Answer | Callable[[SeenRequest], Answer]


def plan(*turns: Turn) -> Callable[[SeenRequest], Answer]:
    """A script of one answer per turn, each an Answer or a function of the request (to use
    ids the model read from its first messages), as a model that plays it out whatever the
    tools answer; a turn past the plan is a 400, as with a list script."""

    def answer(seen: SeenRequest) -> Answer:
        if not 0 < seen.turn <= len(turns):
            return fail(400, f"the test's plan has no answer for turn {seen.turn}")
        turn = turns[seen.turn - 1]
        return turn if isinstance(turn, Answer) else turn(seen)

    return answer


def planned_by(planner: Callable[[Any], Any]) -> Callable[[SeenRequest], Answer]:
    """A script that answers as an offline planner would (`agentflow.agent.ScriptedModel`'s
    planner: a function of the request returning a Plan), so a run served over HTTP by the
    real SDK takes the same turns as one that uses the scripted model in process."""
    from agentflow.agent.conversation import ModelRequest

    def answer(seen: SeenRequest) -> Answer:
        request = ModelRequest(
            model=str(seen.body.get("model", "")),
            messages=tuple(seen.messages),
            tools=tuple(seen.body.get("tools", [])),
        )
        plan = planner(request)
        if plan.answer is not None:
            return reply(plan.answer)
        return tool_calls(*((planned.name, planned.arguments) for planned in plan.calls))

    return answer
