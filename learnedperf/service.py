"""The HTTP service: FastAPI + uvicorn over :class:`~learnedperf.predict.Predictor`.

Endpoints (``learnedperf serve``, 127.0.0.1:8000 by default; the OpenAPI schema is at
``/openapi.json`` and browsable at ``/docs``):

* ``POST /predict`` — body: one run in the run format of DESIGN.md; query ``tier``
  (``fast`` by default, or ``full``). Answers the prediction object.
* ``POST /predict/batch`` — body ``{"runs": [...], "tier": "fast"}``. Answers
  ``{"predictions": [...], "failed": N}``: one entry per run, in order; a bad run gets
  ``{"error": "...", "index": i}`` in its place and the others are still answered.
* ``POST /search`` — body ``{"model": ..., "hardware": ..., "constraints": {...}, "top": N}``.
  Answers :meth:`Predictor.search`'s result (``"results"``: the best strategies).
* ``GET /health`` — ``{"status": "ok", "checkpoint": ..., "version": ...}``.

Every error answer is a JSON object ``{"error": "..."}`` that names the problem, never
a traceback:

* 400 — the body is not JSON (malformed, NaN/Infinity, nested too deeply, an integer
  longer than Python converts) or has the wrong shape (not an object, a field of the
  wrong JSON type, an unknown field of the batch / search envelope);
* 413 — the body is larger than ``max_body_bytes`` (checked on ``Content-Length``
  before reading, and on the bytes actually read) or a batch has more than ``max_batch`` runs;
* 415 — a ``Content-Type`` other than JSON;
* 422 — the request is well-formed but the run (or the search) is invalid: the message
  names the field, as the command line does;
* 404 / 405 — unknown path / method;
* 503 — the checkpoint cannot be loaded (a fault of the server, not of the request).

Concurrency: one request at a time uses a predictor (an ``asyncio.Lock``; the
predictor's caches are not made for threads). Fast predictions run in the event loop's
thread, cheaper than a hand-over to a thread, and the ``/predict`` requests that arrive
together are answered by one ``predict_many`` call (the surrogate's per-call cost, most
of a single prediction's, is paid once for the group). Long work (``/search``, the full
tier) runs in one worker thread on a fork of the predictor (same loaded models, its own
caches, its own lock), so that meanwhile the event loop still reads requests, answers
``/health``, refuses bad input and answers fast predictions. A batch is answered in chunks, letting the
other clients' requests in between. One process uses about one core:
scale out with more processes (several ``learnedperf serve``, or
``uvicorn --factory learnedperf.service:create_app --workers N``).

Importing this module imports FastAPI and uvicorn, not torch: the predictor (and the
models under it) load when :func:`serve` starts or on the first request.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import json
import logging
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional

import uvicorn
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import __version__
from .errors import LearnedPerfError
from .io import dumps_line
from .predict import TIERS, check_tier, error_text

DEFAULT_MAX_BODY_BYTES = 8 << 20
"""Largest request body accepted (bytes) unless ``max_body_bytes`` says otherwise: 8 MiB, so that a
batch of :data:`DEFAULT_MAX_BATCH` runs of ~200 bytes each fits with room to spare."""

DEFAULT_MAX_BATCH = 10_000
"""Most runs in one ``/predict/batch`` request unless ``max_batch`` says otherwise."""

MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects accepted in a body (a run is about 5 deep)."""

# Runs per predict_many call in a batch, by tier: ~25-50 ms of work, after which the other requests get a turn.
_CHUNK = {"fast": 256, "full": 4}

log = logging.getLogger("learnedperf.service")

_EXAMPLE_RUN = {"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 8},
                "strategy": {"tp": 2, "pp": 1, "micro_batch_size": 1, "global_batch_size": 32}}
_RUN_SCHEMA = {
    "type": "object",
    "description": "One run in the run format of DESIGN.md: model (catalog name or inline architecture), "
                   "hardware (cluster or device, num_devices, ...), strategy (tp, pp, dp, micro_batch_size, ...); "
                   "optional id and meta. Validated by learnedperf itself: an invalid run is a 422 naming the field.",
    "required": ["model", "hardware"],
    "properties": {"model": {"description": "catalog name or inline architecture object"},
                   "hardware": {"type": "object"}, "strategy": {"type": "object"},
                   "id": {"description": "echoed in the prediction"}, "meta": {"type": "object"}},
    "example": _EXAMPLE_RUN,
}
_TIER_SCHEMA = {"type": "string", "enum": list(TIERS), "default": "fast"}
_BATCH_SCHEMA = {
    "type": "object", "required": ["runs"],
    "properties": {"runs": {"type": "array", "items": _RUN_SCHEMA}, "tier": _TIER_SCHEMA},
    "example": {"runs": [_EXAMPLE_RUN, {**_EXAMPLE_RUN, "strategy": {"tp": 4}}], "tier": "fast"},
}
_SEARCH_SCHEMA = {
    "type": "object", "required": ["model", "hardware"],
    "properties": {
        "model": {"description": "catalog name or inline architecture object"},
        "hardware": {"type": "object", "description": 'e.g. {"cluster": "dgx-a100", "num_devices": 64}'},
        "constraints": {"type": "object", "description": 'e.g. {"global_batch_size": 512}'},
        "top": {"type": "integer", "minimum": 1, "default": 10},
    },
    "example": {"model": "gpt3-1.3b", "hardware": {"cluster": "dgx-a100", "num_devices": 64},
                "constraints": {"global_batch_size": 512}, "top": 5},
}


class ErrorBody(BaseModel):
    """The body of every error answer."""

    error: str


class HealthBody(BaseModel):
    """The body of ``GET /health``."""

    status: str
    checkpoint: str
    version: str


def _errors(*codes: int) -> dict:
    """OpenAPI ``responses`` entries for the error codes an endpoint can answer."""
    what = {400: "malformed JSON or a field of the wrong type", 413: "body or batch too large",
            415: "Content-Type is not JSON", 422: "invalid run or search (the message names the field)",
            503: "the checkpoint cannot be loaded"}
    return {code: {"model": ErrorBody, "description": what[code]} for code in codes}


def _post(app: FastAPI, path: str, summary: str, schema: dict, description: str) -> Callable:
    """The decorator of a POST endpoint that reads its JSON body itself (``schema`` documents it)."""
    return app.post(path, summary=summary, description=description, response_class=JSONBody,
                    responses=_errors(400, 413, 415, 422, 503),
                    openapi_extra={"requestBody": {"required": True,
                                                   "content": {"application/json": {"schema": schema}}}})


class JSONBody(Response):
    """A JSON response; non-finite floats are written as ``null`` (strict JSON has no NaN)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """``content`` as UTF-8 JSON."""
        return dumps_line(content).encode("utf-8")


class HTTPError(Exception):
    """An error answer: ``status`` and the ``{"error": message}`` body."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# ---------------------------------------------------------------- reading bodies
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (use a finite number)")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # 1e999 parses to inf
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether arrays / objects nest deeper than ``limit`` in ``value`` (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


async def _read_object(request: Request, max_bytes: int) -> dict:
    """The request's body as a JSON object, within ``max_bytes``; raises :class:`HTTPError` (400/413/415)."""
    ctype = request.headers.get("content-type")
    if ctype is not None:
        media = ctype.split(";", 1)[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise HTTPError(415, f"Content-Type {ctype[:80]!r} is not JSON: send application/json")
    too_large = f"request body larger than {max_bytes:,} bytes (max_body_bytes)"
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise HTTPError(413, too_large)  # refused before reading a byte of it
    chunks, size = [], 0
    async for chunk in request.stream():  # counted too: a chunked body declares no length
        size += len(chunk)
        if size > max_bytes:
            raise HTTPError(413, too_large)
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body.strip():
        raise HTTPError(400, "empty body: expected a JSON object")
    try:
        value = json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise HTTPError(400, f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise HTTPError(400, f"invalid JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except UnicodeDecodeError as exc:
        raise HTTPError(400, f"invalid JSON: not UTF-8 text ({exc.reason})") from None
    except ValueError as exc:  # NaN / Infinity / 1e999, or an integer too long to convert
        text = str(exc)
        if "integer string conversion" in text:
            text = f"an integer has more than {sys.get_int_max_str_digits()} digits"
        raise HTTPError(400, f"invalid JSON: {text}") from None
    if not isinstance(value, dict):
        raise HTTPError(400, f"expected a JSON object, got {_json_type(value)}")
    if _too_deep(value):
        raise HTTPError(400, f"invalid JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _check_keys(body: dict, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
    """Unknown keys of an envelope are a 400, missing required ones a 422."""
    unknown = [k for k in body if k not in allowed]
    if unknown:
        raise HTTPError(400, f"{unknown[0]}: unknown field (expected {', '.join(allowed)})")
    for key in required:
        if key not in body:
            raise HTTPError(422, f"{key}: required field is missing")


def _typed(body: dict, key: str, types: tuple[type, ...], what: str, default: Any = None) -> Any:
    """``body[key]`` if it has one of ``types`` (booleans are not numbers), else a 400 naming the key."""
    value = body.get(key, default)
    if value is default:
        return value
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise HTTPError(400, f"{key}: expected {what}, got {_json_type(value)}")
    return value


def _tier(value: Any) -> str:
    """A batch's ``tier``: a 400 if it is not a string, a 422 if it is not a known tier.

    Checked here, up front, rather than left to the predictor: an empty batch never reaches the
    predictor, so an unknown tier would otherwise be answered 200 when the batch is empty and 422
    when it is not. The message is the predictor's own.
    """
    if not isinstance(value, str):
        raise HTTPError(400, f"tier: expected a string ({' or '.join(TIERS)}), got {_json_type(value)}")
    try:
        return check_tier(value)
    except LearnedPerfError as exc:
        raise HTTPError(422, str(exc)) from None


# ---------------------------------------------------------------- the app
class _Service:
    """What the endpoints share: the limits, and the predictor with the lock that serialises its use."""

    def __init__(self, predictor: Any, checkpoint: Optional[str], max_body_bytes: int, max_batch: int):
        self.predictor = predictor
        self.checkpoint = checkpoint
        self.max_body_bytes = max_body_bytes
        self.max_batch = max_batch
        self._lock: Optional[asyncio.Lock] = None
        self._lock_loop: Optional[asyncio.AbstractEventLoop] = None
        self._worker: Optional[ThreadPoolExecutor] = None
        self._queue: list[tuple[Any, asyncio.Future]] = []  # fast-tier runs waiting for the next predict_many
        self._slow: Any = None  # the worker thread's own predictor (Predictor.fork), made on first use
        self._slow_lock: Optional[asyncio.Lock] = None
        self._slow_lock_loop: Optional[asyncio.AbstractEventLoop] = None
        self._flushes: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    def lock(self) -> asyncio.Lock:
        """The predictor's lock, made for the running event loop (an app may be served by several in turn)."""
        loop = asyncio.get_running_loop()
        if self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock  # type: ignore[return-value]

    async def _in_worker(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="learnedperf-predict")
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def loaded(self) -> Any:
        """The predictor, loaded (once, in the worker thread) on first use; a failure is a 503."""
        if self.predictor is None:
            async with self.lock():
                if self.predictor is None:
                    self.predictor = await self._in_worker(self._load)
        return self.predictor

    def _load(self) -> Any:
        from .predict import Predictor

        try:
            return Predictor.load(self.checkpoint)
        except Exception as exc:  # noqa: BLE001 - a missing / corrupt checkpoint is the server's fault
            log.exception("cannot load the checkpoint")
            raise HTTPError(503, f"the checkpoint cannot be loaded: {error_text(exc)}") from None

    async def call(self, fn: Callable[[Any], Any], offload: bool = False) -> Any:
        """``fn(predictor)``, holding the predictor's lock; a failure is a 422 naming the problem, never a 500.

        ``offload`` runs it in the worker thread, for work long enough (search, the full tier) that
        the event loop should go on answering meanwhile (``/health``, bad requests, reading bodies);
        short work runs here, where it costs no thread hand-over.
        """
        predictor = await self.loaded()
        if offload:
            slow, lock = self._slow_lane(predictor)
            async with lock:
                return await self._in_worker(self._answer, fn, slow)
        async with self.lock():
            return self._answer(fn, predictor)

    def _slow_lane(self, predictor: Any) -> tuple[Any, asyncio.Lock]:
        """The worker thread's predictor and its lock. With a forked predictor (its own caches) a
        search or a full-tier prediction does not hold the fast lane's lock, so fast predictions go
        on meanwhile; a predictor that cannot fork shares the fast lane's lock."""
        if self._slow is None:
            self._slow = predictor.fork() if hasattr(predictor, "fork") else predictor
        if self._slow is predictor:
            return predictor, self.lock()
        loop = asyncio.get_running_loop()
        if self._slow_lock_loop is not loop:
            self._slow_lock, self._slow_lock_loop = asyncio.Lock(), loop
        return self._slow, self._slow_lock  # type: ignore[return-value]

    async def predict_fast(self, run: Any) -> dict:
        """The fast-tier prediction of one run; a failure is a 422 naming the problem.

        Requests that arrive together (in one turn of the event loop, or while the predictor is
        busy) are answered by one ``predict_many`` call: the surrogate's per-call cost is paid
        once for all of them, which under many concurrent clients is most of the time a request takes.
        """
        predictor = await self.loaded()
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._queue.append((run, future))
        if len(self._queue) == 1:  # the first of a new group schedules its flush, after this turn of the loop
            task = loop.create_task(self._flush(predictor))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)
        return await future

    async def _flush(self, predictor: Any) -> None:
        async with self.lock():
            group, self._queue = self._queue, []
            try:
                preds = self._answer(lambda p: p.predict_many([run for run, _ in group], tier="fast",
                                                              errors="return"), predictor)
            except HTTPError as exc:  # the whole call failed (e.g. a checkpoint without a fast tier)
                preds = [{"error": exc.message}] * len(group)
            for (_, future), pred in zip(group, preds):
                if future.done():  # the client went away
                    continue
                if "error" in pred:
                    future.set_exception(HTTPError(422, pred["error"]))
                else:
                    future.set_result(pred)

    @staticmethod
    def _answer(fn: Callable[[Any], Any], predictor: Any) -> Any:
        try:
            return fn(predictor)
        except RecursionError:
            raise HTTPError(422, "input nested too deeply") from None
        except Exception as exc:  # noqa: BLE001 - whatever one request's input triggers is that request's error
            if not isinstance(exc, (LearnedPerfError, ValueError, KeyError, TypeError)):
                log.exception("unexpected error while answering a request")
            raise HTTPError(422, error_text(exc)) from None


def create_app(predictor: Any = None, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               max_batch: int = DEFAULT_MAX_BATCH, checkpoint: Optional[str] = None) -> FastAPI:
    """The FastAPI application of the service.

    Args:
        predictor: a loaded :class:`~learnedperf.predict.Predictor`; ``None`` loads
            ``checkpoint`` once, on the first request that needs it.
        max_body_bytes: largest request body accepted; a larger one is a 413.
        max_batch: most runs in one ``/predict/batch`` request; more is a 413.
        checkpoint: checkpoint directory when ``predictor`` is None (default ``checkpoints/default``).

    Raises:
        ValueError: a limit is below 1.
    """
    if max_body_bytes < 1 or max_batch < 1:
        raise ValueError(f"max_body_bytes and max_batch must be >= 1, got {max_body_bytes} and {max_batch}")
    state = _Service(predictor, checkpoint, max_body_bytes, max_batch)
    app = FastAPI(title="learnedperf", version=__version__, default_response_class=JSONBody,
                  description="Predict iteration time, throughput and memory of distributed deep-learning "
                              "training before it runs. Every error answer is `{\"error\": \"...\"}`.")
    app.state.service = state
    _add_error_handlers(app)

    @_post(app, "/predict", "Predict one run", _RUN_SCHEMA,
           "The body is one run in the run format. Answers the prediction object: iteration_time_ms, "
           "tokens_per_second, samples_per_second, tflops_per_device, mfu, peak_memory_GiB, fits_in_memory, "
           "breakdown_ms, interval_ms (90 %), source.")
    async def predict(request: Request,
                      tier: str = Query("fast", description="fast (surrogate) or full (simulator + GNN)")
                      ) -> Response:
        """``POST /predict``."""
        run = await _read_object(request, state.max_body_bytes)
        if tier == "fast":
            return JSONBody(await state.predict_fast(run))
        return JSONBody(await state.call(lambda p: p.predict(run, tier=tier), offload=True))

    @_post(app, "/predict/batch", "Predict many runs", _BATCH_SCHEMA,
           'Answers {"predictions": [...], "failed": N}: one entry per run, in order; an invalid run gets '
           '{"error": "...", "index": i} (and its id) in its place, the others are still answered.')
    async def predict_batch(request: Request) -> Response:
        """``POST /predict/batch``."""
        body = await _read_object(request, state.max_body_bytes)
        _check_keys(body, ("runs", "tier"), required=("runs",))
        runs = _typed(body, "runs", (list,), "an array of runs")
        tier = _tier(body.get("tier", "fast"))
        if len(runs) > state.max_batch:
            raise HTTPError(413, f"runs: {len(runs):,} runs is more than the limit of {state.max_batch:,} "
                                 "(max_batch): split the batch")
        step = _CHUNK.get(tier, max(len(runs), 1))
        predictions: list = []
        for start in range(0, len(runs), step):
            if start:
                await asyncio.sleep(0)  # let the other clients' requests in between chunks
            chunk = await state.call(lambda p: p.predict_many(runs[start:start + step], tier=tier, errors="return"),
                                     offload=tier != "fast")
            for item in chunk:
                if start and isinstance(item, dict) and "error" in item and isinstance(item.get("index"), int):
                    item["index"] += start  # predict_many numbers the runs of its chunk
            predictions.extend(chunk)
        failed = sum(isinstance(item, dict) and "error" in item for item in predictions)
        return JSONBody({"predictions": predictions, "failed": failed})

    @_post(app, "/search", "Best strategies for a model on a cluster", _SEARCH_SCHEMA,
           "Enumerates the valid parallelization strategies of the model on the hardware under the "
           "constraints, and answers the best `top` that fit in memory, ranked, with their intervals (`results`).")
    async def search(request: Request) -> Response:
        """``POST /search``."""
        body = await _read_object(request, state.max_body_bytes)
        _check_keys(body, ("model", "hardware", "constraints", "top"), required=("model", "hardware"))
        constraints = _typed(body, "constraints", (dict,), "an object")
        top = _typed(body, "top", (int,), "a whole number", default=10)
        if top < 1:
            raise HTTPError(422, f"top: expected a number >= 1, got {top}")
        return JSONBody(await state.call(lambda p: p.search(body["model"], body["hardware"], constraints=constraints,
                                                            top=top), offload=True))

    @app.get("/health", summary="Liveness and the checkpoint in use", response_model=HealthBody,
             responses=_errors(503))
    async def health() -> Response:
        """Answers the status, the checkpoint that answers predictions (its ``source``) and the package version."""
        predictor = await state.loaded()  # answers at once while a long request holds the predictor
        return JSONBody({"status": "ok", "checkpoint": str(predictor.source), "version": __version__})

    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error answer is ``{"error": "..."}``, whatever raised it."""

    @app.exception_handler(HTTPError)
    async def _ours(request: Request, exc: HTTPError) -> Response:
        return JSONBody({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _routing(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            text = f"not found: {request.url.path} (endpoints: /predict, /predict/batch, /search, /health, /docs)"
        elif exc.status_code == 405:
            text = f"method {request.method} is not allowed on {request.url.path}"
        else:
            text = str(exc.detail)
        return JSONBody({"error": text}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _parameters(request: Request, exc: RequestValidationError) -> Response:
        parts = [f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg', 'invalid')}" for e in exc.errors()]
        return JSONBody({"error": "; ".join(parts) or "invalid request"}, status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        # a fault of this module: logged with its traceback by uvicorn; the client gets no traceback
        return JSONBody({"error": "internal server error"}, status_code=500)


# ---------------------------------------------------------------- running it
def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: an ephemeral one). Raises OSError."""
    family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _server(app: FastAPI, **options: Any) -> uvicorn.Server:
    # the access log costs a log record per request: off unless asked for
    return uvicorn.Server(uvicorn.Config(app, access_log=options.pop("access_log", False), **options))


def serve(host: str = "127.0.0.1", port: int = 8000, checkpoint: Optional[str] = None, *,
          max_batch: int = DEFAULT_MAX_BATCH, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
          allow_remote: bool = False, access_log: bool = False, log_level: str = "warning") -> int:
    """Run the service until interrupted (Ctrl+C); return the exit status.

    Loads and verifies the checkpoint first, binds ``host:port`` (port 0 picks a free
    one), then prints one line with the URL to standard error.

    Args:
        host: address to listen on; a non-loopback one needs ``allow_remote=True``
            (the service has no authentication).
        port: TCP port (0: any free port).
        checkpoint: checkpoint directory (default ``checkpoints/default``).
        max_batch: most runs in one ``/predict/batch`` request.
        max_body_bytes: largest request body.
        allow_remote: listen on a non-loopback address.
        access_log: log one line per request (costs throughput).
        log_level: uvicorn's log level.

    Returns:
        0 after a clean shutdown; 1 when the checkpoint cannot be loaded or the address
        cannot be bound; 2 when ``host`` is not loopback and ``allow_remote`` is False.
    """
    prog = "learnedperf serve"
    if not allow_remote and not is_loopback(host):
        print(f"{prog}: error: --host {host} is not a loopback address: the service has no authentication, so it "
              "listens only on this machine unless remote access is allowed explicitly (--allow-remote)",
              file=sys.stderr)
        return 2
    from .predict import Predictor

    try:
        predictor = Predictor.load(checkpoint)
        # the models live as long as the server: keep the cyclic collector from re-scanning them
        # (torch's heap) on every collection, which otherwise shows in the p99 latency
        gc.freeze()
        app = create_app(predictor, max_body_bytes=max_body_bytes, max_batch=max_batch)
    except (LearnedPerfError, ValueError) as exc:
        print(f"{prog}: error: {error_text(exc)}", file=sys.stderr)
        return 1
    try:
        sock = _bind(host, port)
    except OSError as exc:
        print(f"{prog}: error: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    url = _url(sock)
    print(f"{prog}: {predictor.source} on {url} (API: {url}/docs; Ctrl+C stops)", file=sys.stderr, flush=True)
    with sock:
        try:
            _server(app, log_level=log_level, access_log=access_log).run(sockets=[sock])
        except KeyboardInterrupt:  # uvicorn shuts down gracefully, then re-raises the Ctrl+C it caught
            pass
    print(f"{prog}: stopped", file=sys.stderr, flush=True)
    return 0


@contextlib.contextmanager
def running(app: FastAPI, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 30.0) -> Iterator[str]:
    """Run ``app`` with uvicorn in a background thread; yield its base URL; stop it on exit.

    For tests and for embedding the service in another program. Logging is left as it is.

    Raises:
        RuntimeError: the server did not start within ``timeout_s``.
    """
    sock = _bind(host, port)
    server = _server(app, log_config=None, log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="learnedperf-service",
                              daemon=True)
    thread.start()
    try:
        for _ in range(int(timeout_s / 0.01)):
            if server.started or not thread.is_alive():
                break
            thread.join(0.01)
        if not server.started:
            raise RuntimeError(f"the service did not start within {timeout_s} s")
        yield _url(sock)
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()


__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_MAX_BODY_BYTES", "ErrorBody", "HTTPError", "HealthBody", "JSONBody",
           "MAX_JSON_DEPTH", "create_app", "is_loopback", "running", "serve"]
