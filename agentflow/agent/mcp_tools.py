"""Tools an MCP server serves, offered to the model as the host declares them.

The server says which tools it has and their JSON schemas; the host says which of them the
model may call, and what each does: `read_only` (a `read` step) or `side_effect` (an `effect`
step, claimed before the call, at most `max_calls` per run). A server's own annotations
(`readOnlyHint`, `destructiveHint`) are its claims about itself and decide nothing: a tool
the host did not declare is never offered, and one it declared a side effect is claimed
however the server describes it. Each call carries the step's idempotency key in the request's
`_meta` (`agentflow/idempotency_key`), so a server that keys its effects by it makes a repeat
of the call after a crash harmless, as a partner does with our `Idempotency-Key` header.

The SDK is asynchronous and this engine is not: every call (and the listing, once per
process) starts the server, makes one request and stops it, inside `anyio.run`. Slower than a
kept session, and nothing of it outlives a call, across a fork or a SIGKILL.

    orders = StdioServer("orders", command=sys.executable, args=["orders_mcp.py"])
    toolbox.add(orders.tool("lookup_order", read_only=True))
    toolbox.add(orders.tool("add_note", side_effect=True, max_calls=2))
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentflow._base.canonical import NotCanonicalError, normalise
from agentflow.agent.arguments import InvalidArguments, Problem
from agentflow.agent.tools import Tool, ToolContext, check_declared
from agentflow.exceptions import (
    AnswerLost,
    DefinitionError,
    MCPUnavailable,
    RepeatUnsafe,
    RetryableStepError,
    ToolRefused,
    ToolServerUnavailable,
)

#: Where in a call's `_meta` the server finds the step's idempotency key.
IDEMPOTENCY_KEY_META = "agentflow/idempotency_key"
#: A server that could not be listed is asked again after this long (an outage: the run
#: waits on partner key `mcp:<name>`, holding no worker).
LIST_RETRY_SECONDS = 5.0
#: How long starting the server and one request may take (a server's `timeout_seconds`): a
#: server that never answers must not hold the worker until its lease runs out.
TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True, kw_only=True)
class ListedTool:
    """One tool as the server lists it: what the model is shown of it."""

    name: str
    description: str
    input_schema: dict[str, Any]


class StdioServer:
    """An MCP server this process starts as a subprocess and speaks to over stdin/stdout.

    `env`: the server's whole environment (the SDK passes it only HOME, PATH and the like
    otherwise, never this process's secrets). `timeout_seconds`: how long starting it and one
    request may take; a call past it, like one whose server went away mid-call, lost its answer
    (`AnswerLost`: it may have happened, see `tool`)."""

    def __init__(
        self,
        name: str,
        *,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_seconds: float = TIMEOUT_SECONDS,
    ) -> None:
        self.name = name
        self.timeout_seconds = float(timeout_seconds)
        self.command, self.args = command, list(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self._listed: dict[str, ListedTool] | None = None
        self._lock = threading.Lock()

    def tool(
        self,
        name: str,
        *,
        read_only: bool = False,
        side_effect: bool = False,
        max_calls: int | None = None,
        description: str | None = None,
        reconcile: str | None = None,
        idempotent: bool = False,
    ) -> Tool:
        """The server's tool `name` as this host declares it, for `Toolbox.add`.

        `description`: what the model reads instead of the server's own. For a side effect
        whose answer was lost (a worker killed after the call, a call that timed out or whose
        server went away mid-call: docs/protocol.md, "Unknown outcomes"), how to learn what it did:
        `reconcile`, a read-only lookup tool of the same server, called with `{"idempotency_key":
        key}`, whose result is adopted (empty: it did not happen, so it is called again); or
        `idempotent=True`, the server keys the effect by the call's idempotency key, so calling
        again is safe. With neither, the run parks "outcome unknown" for a person, never
        calling again blindly.

        Raises:
            DefinitionError: not exactly one of `read_only` / `side_effect`, a `max_calls`
                below 1, or a read-only tool given a way to reconcile.
        """
        check_declared(self.name, name, read_only=read_only, side_effect=side_effect)
        if max_calls is not None and max_calls < 1:
            raise DefinitionError(f"{self.name}: tool {name!r} needs max_calls of at least 1")
        if read_only and (reconcile or idempotent):
            raise DefinitionError(f"{self.name}: read-only tool {name!r} has nothing to reconcile")
        if reconcile and idempotent:
            raise DefinitionError(f"{self.name}: tool {name!r}: reconcile or idempotent, not both")
        found: Any = None
        if side_effect and reconcile:
            found = _Lookup(self, reconcile)
        elif side_effect and not idempotent:
            found = _Unsafe(self.name, name)
        return ServerTool(
            reconcile=found,
            name=name,
            description=" ".join((description or "").split()),
            side_effect=side_effect,
            fn=_Call(self, name),
            arguments=ServerArguments(self, name),
            max_calls=max_calls if max_calls is not None or read_only else 1,
        )

    def listed(self, name: str) -> ListedTool:
        """The server's listing of `name`, read once per process (a schema that changes under
        a running process would change every later turn's fingerprint mid-run).

        Raises:
            DefinitionError: the server lists no such tool.
        """
        self.ensure_listed()
        assert self._listed is not None
        found = self._listed.get(name)
        if found is None:
            raise DefinitionError(
                f"MCP server {self.name!r} lists no tool {name!r} (it lists "
                f"{', '.join(sorted(self._listed)) or 'none'})"
            )
        return found

    @property
    def partner(self) -> str:
        """The partner key its outages and limits go by (AGENTFLOW_PARTNER_LIMITS may name it)."""
        return f"mcp:{self.name}"

    @property
    def is_listed(self) -> bool:
        """Has this process read the server's listing (so a replay asks it nothing)?"""
        return self._listed is not None

    def ensure_listed(self) -> None:
        """List the server's tools now, if this process has not yet (the runtime does it
        before a replay, as a call to partner `partner`, through the limiter).

        Raises:
            ToolServerUnavailable: it could not be started, or did not answer the listing.
        """
        with self._lock:
            if self._listed is None:
                self._listed = {tool.name: tool for tool in self._list()}

    def _list(self) -> list[ListedTool]:
        try:
            listed: list[ListedTool] = self._run(_list_tools)
        except RetryableStepError as exc:
            raise ToolServerUnavailable(
                self.partner, f"cannot be listed: {exc}", retry_after_seconds=LIST_RETRY_SECONDS
            ) from exc
        return listed

    def call(self, name: str, arguments: dict[str, Any], *, key: str) -> Any:
        """Call tool `name` with the step's idempotency key in `_meta`; its result as JSON.

        Raises:
            ToolRefused: the server answered the call with an error (the model reads it).
            AnswerLost: the request went and no answer came (timed out, the server went away):
                it may have happened, so the retry asks the tool's reconcile first.
            RetryableStepError: the server could not be started or initialised: nothing was
                asked, and the step retries under the same key.
        """
        sent = _Sent()
        try:
            return self._run(_call_tool, name, arguments, {IDEMPOTENCY_KEY_META: key}, sent)
        except RetryableStepError as exc:
            if not sent:
                raise
            raise AnswerLost(f"{exc} (after the call was sent: it may have happened)") from exc

    def _run(self, fn: Any, *args: Any) -> Any:
        try:
            import anyio
            from mcp.client.stdio import StdioServerParameters
        except ImportError:
            raise MCPUnavailable() from None
        parameters = StdioServerParameters(
            command=self.command, args=self.args, env=self.env, cwd=self.cwd
        )
        try:
            return anyio.run(fn, parameters, self.timeout_seconds, *args)
        except (ToolRefused, MCPUnavailable):
            raise
        except Exception as exc:
            raise RetryableStepError(
                f"MCP server {self.name!r}: {type(exc).__name__}: {_message(exc)}"
            ) from exc


def tool_servers(toolbox: Any) -> list[StdioServer]:
    """The MCP servers `toolbox`'s tools come from, once each, in the order first declared."""
    servers: dict[int, StdioServer] = {}
    for tool in getattr(toolbox, "tools", ()):
        arguments = getattr(tool, "arguments", None)
        if isinstance(tool, ServerTool) and isinstance(arguments, ServerArguments):
            servers.setdefault(id(arguments.server), arguments.server)
    return list(servers.values())


@dataclass(frozen=True, kw_only=True)
class ServerTool(Tool):
    """A tool an MCP server runs: shown to the model with the server's schema (and its
    description, unless the host gave one)."""

    def openai_format(self) -> dict[str, Any]:
        assert isinstance(self.arguments, ServerArguments)
        listed = self.arguments.listed()
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description or " ".join(listed.description.split()),
                "parameters": listed.input_schema,
            },
        }


@dataclass(frozen=True)
class _Call:
    """A server tool's function: the call, with the step's key (a plain object, so the
    tool's arguments are the schema's, not this function's signature)."""

    server: StdioServer
    name: str

    def __call__(self, ctx: ToolContext, **values: Any) -> Any:
        return self.server.call(self.name, values, key=ctx.idempotency_key)


@dataclass(frozen=True)
class _Lookup:
    """A side effect's reconcile: the server's read-only lookup tool `name`, asked for the
    effect made under the call's key (an empty answer: none was)."""

    server: StdioServer
    name: str

    def __call__(self, ctx: ToolContext, **values: Any) -> Any:
        key = ctx.idempotency_key
        try:
            found = self.server.call(self.name, {"idempotency_key": key}, key=key)
        except (RetryableStepError, ToolRefused) as exc:
            # The engine takes a reconcile that raises inside the key's window as "the key
            # protects a repeat"; this effect's server keys nothing, so a lookup that cannot
            # answer parks the step instead of calling the effect blind.
            raise RepeatUnsafe(
                f"MCP server {self.server.name!r}: {self.name}, the lookup of a side effect that "
                f"may have run, could not answer ({exc}), and the effect is not keyed by its "
                "idempotency key, so it is not called again"
            ) from exc
        return found or None


@dataclass(frozen=True)
class _Unsafe:
    """A side effect with no way to learn what a lost call did, on a server not declared to
    key its effects: a repeat could make it twice, so the step parks (`RepeatUnsafe`)."""

    server: str
    name: str

    def __call__(self, ctx: ToolContext, **values: Any) -> Any:
        raise RepeatUnsafe(
            f"MCP server {self.server!r}: {self.name} may have run, and the host declared no "
            "reconcile lookup and no idempotency by key for it, so it is not called again"
        )


@dataclass(eq=False)
class ServerArguments:
    """A server tool's arguments, checked against the schema it lists before any call, as a
    local tool's are against its type hints. Arguments the schema does not name are refused
    unless it allows more (`additionalProperties`), as a local tool refuses them."""

    server: StdioServer
    tool: str
    _validator: Any = field(default=None, repr=False)

    def listed(self) -> ListedTool:
        return self.server.listed(self.tool)

    @property
    def schema(self) -> dict[str, Any]:
        return self.listed().input_schema

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.schema.get("properties", {}))

    def validate(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise InvalidArguments([Problem(field="", problem="arguments must be a JSON object")])
        try:
            values = normalise(arguments)
        except NotCanonicalError as exc:
            raise InvalidArguments([Problem(field="", problem=str(exc))]) from None
        problems = [
            Problem(field=".".join(str(part) for part in error.path), problem=error.message)
            for error in sorted(self._checker().iter_errors(values), key=str)
        ]
        if "additionalProperties" not in self.schema:
            problems += [
                Problem(field=extra, problem="Extra inputs are not permitted")
                for extra in sorted(set(values) - set(self.names))
            ]
        if problems:
            raise InvalidArguments(problems)
        return dict(values)

    def _checker(self) -> Any:
        if self._validator is None:
            try:
                import jsonschema
            except ImportError:
                raise MCPUnavailable() from None
            cls = jsonschema.validators.validator_for(self.schema)
            self._validator = cls(self.schema)
        return self._validator


class _Sent:
    """Whether a call's request went to the server (past it, a lost answer may have acted)."""

    def __init__(self) -> None:
        self.sent = False

    def __bool__(self) -> bool:
        return self.sent


async def _list_tools(parameters: Any, timeout: float) -> list[ListedTool]:
    import anyio
    import mcp_types
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    listed: list[ListedTool] = []
    with anyio.fail_after(timeout):
        async with stdio_client(parameters) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            cursor = None
            while True:
                params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await s.list_tools(params=params)
                listed += [
                    ListedTool(
                        name=tool.name,
                        description=tool.description or "",
                        input_schema=dict(tool.input_schema),
                    )
                    for tool in page.tools
                ]
                cursor = page.next_cursor
                if not cursor:
                    return listed


async def _call_tool(
    parameters: Any, timeout: float, name: str, arguments: dict, meta: Any, sent: _Sent
) -> Any:
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    with anyio.fail_after(timeout):
        async with stdio_client(parameters) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            sent.sent = True  # from here on, the server may act on it
            result = await s.call_tool(name, arguments, meta=meta)
    if result.is_error:
        raise ToolRefused(_text(result.content) or "the server reported an error")
    if result.structured_content is not None:
        return result.structured_content
    return _content(result.content)


def _content(content: Sequence[Any]) -> Any:
    """A result without structured content: its text (JSON text read as JSON), or its
    content blocks as JSON when they are not all text."""
    if all(getattr(block, "type", None) == "text" for block in content):
        text = _text(content)
        try:
            return json.loads(text)
        except ValueError:
            return text
    return [block.model_dump(mode="json", exclude_none=True) for block in content]


def _text(content: Sequence[Any]) -> str:
    return "\n".join(block.text for block in content if getattr(block, "type", None) == "text")


def _message(exc: BaseException) -> str:
    """An exception group's first leaf (anyio wraps a task group's errors in one)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__
