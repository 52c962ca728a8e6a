"""JSON Lines input and output shared by the stages and front ends.

Runs, records and predictions travel as JSON Lines: one JSON object per line.
The readers here never stop at a bad line: they yield an :class:`InputError`
for it, naming the line, and go on, so that a batch of thousands of runs is not
lost to one typo. ``"-"`` as a path means standard input / standard output.

Only the standard library is imported.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from typing import IO, Any, Iterable, Iterator, TextIO, Union

from .errors import InputError

PathOrStream = Union[str, "os.PathLike[str]", IO[str]]
"""A file path, ``"-"`` (stdin / stdout) or an open text stream."""

Item = Union[dict, InputError]
"""What the readers yield per record: the parsed object, or the error that replaced it."""

_BOM = "\ufeff"  # the byte-order mark, as a UTF-8 file that starts with one reads when decoded as plain utf-8


def _describe(path: Any) -> str:
    return "<stdin>" if path == "-" else os.fspath(path)


def open_input(path: str | os.PathLike[str]) -> TextIO:
    """Open ``path`` for reading UTF-8 text (a leading byte-order mark is dropped); ``"-"`` returns :data:`sys.stdin`.

    Raises:
        InputError: the file is missing, a directory or unreadable; the message names the path.
    """
    if path == "-":
        return sys.stdin
    try:
        # utf-8-sig: editors on Windows save UTF-8 with a byte-order mark, which json.loads refuses
        # ("Unexpected UTF-8 BOM"); the codec drops it and reads the rest as plain UTF-8
        return open(path, encoding="utf-8-sig")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise InputError(f"{_describe(path)}: cannot read: {exc.strerror or exc}") from None


def open_output(path: str | os.PathLike[str]) -> TextIO:
    """Open ``path`` for writing UTF-8 text (truncating it); ``"-"`` returns :data:`sys.stdout`.

    Raises:
        InputError: the file cannot be created or written; the message names the path.
    """
    if path == "-":
        return sys.stdout
    try:
        return open(path, "w", encoding="utf-8")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise InputError(f"{_describe(path)}: cannot write: {exc.strerror or exc}") from None


@contextmanager
def _reading(source: PathOrStream) -> Iterator[IO[str]]:
    """Yield a readable stream for ``source``; close it afterwards only if this function opened it."""
    if hasattr(source, "read"):
        yield source  # type: ignore[misc]
        return
    stream = open_input(source)  # type: ignore[arg-type]
    try:
        yield stream
    finally:
        if stream is not sys.stdin:
            stream.close()


def _decode(text: str, line_no: int) -> Item:
    """Parse one line into a JSON object, or return the InputError that describes why not."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return InputError(f"line {line_no}: invalid JSON: {exc.msg} (column {exc.colno})")
    except RecursionError:
        return InputError(f"line {line_no}: invalid JSON: nested too deeply")
    if not isinstance(value, dict):
        return InputError(f"line {line_no}: expected a JSON object, got {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _lines(stream: IO[str]) -> Iterator[tuple[int, str]]:
    """Non-blank lines of ``stream``, stripped, with their 1-based line numbers (a leading byte-order mark
    dropped)."""
    for line_no, line in enumerate(stream, start=1):
        if line_no == 1:
            # a stream this module did not open (stdin, a caller's file) may still start with the
            # mark that open_input's utf-8-sig drops; str.strip() keeps it (it is not whitespace)
            line = line.removeprefix(_BOM)
        if line.strip():
            yield line_no, line.strip()


def read_jsonl(source: PathOrStream) -> Iterator[tuple[int, Item]]:
    """Read JSON Lines: yield ``(line_number, object)`` per non-blank line, in order.

    A line that is not a JSON object yields ``(line_number, InputError)`` whose
    message starts with ``"line N: "``; reading continues with the next line.
    Line numbers count every physical line (blank ones included), from 1.

    Args:
        source: a path, ``"-"`` for standard input, or an open text stream
            (left open; a path is closed when the iteration ends).

    Raises:
        InputError: ``source`` is a path that cannot be opened (raised on the first ``next()``).
    """
    with _reading(source) as stream:
        for line_no, line in _lines(stream):
            yield line_no, _decode(line, line_no)


def read_records(source: PathOrStream) -> Iterator[tuple[int, Item]]:
    """Like :func:`read_jsonl`, but also accept one JSON object spread over several lines.

    A ``.json`` file holding a single pretty-printed object is one record (line
    number of its first line). Detection: if the first non-blank line is not
    valid JSON on its own, the whole content is tried as one JSON document; if
    that is not an object either, the content is read as JSON Lines after all
    (so each bad line gets its own error), except that a JSON array (one line or
    pretty-printed over many) yields one InputError saying so, and nothing else.
    Only then is the rest of the input buffered; a valid JSON Lines input is streamed.
    A leading byte-order mark is dropped.

    Raises:
        InputError: ``source`` is a path that cannot be opened.
    """
    with _reading(source) as stream:
        lines = _lines(stream)
        first = next(lines, None)
        if first is None:
            return
        first_no, first_line = first
        item = _decode(first_line, first_no)
        if not isinstance(item, InputError) or not first_line.lstrip().startswith(("{", "[")):
            yield first_no, item
            yield from ((n, _decode(text, n)) for n, text in lines)
            return
        rest = list(lines)
        try:
            whole = json.loads("\n".join([first_line, *(text for _, text in rest)]))
        except (json.JSONDecodeError, RecursionError):
            whole = None
        if isinstance(whole, dict):
            yield first_no, whole
            return
        if isinstance(whole, list):
            # a JSON array of runs (pretty-printed or not) is a common mistake for JSON Lines: one
            # error saying so, rather than one "invalid JSON" per line of the array
            items = f"{len(whole)} item{'' if len(whole) == 1 else 's'}"
            yield first_no, InputError(f"line {first_no}: the input is a JSON array ({items}), not JSON Lines: "
                                       "expected JSON Lines (one JSON object, e.g. one run, per line) or a single "
                                       "JSON object; put each element on a line of its own (e.g. jq -c '.[]')")
            return
        yield first_no, item
        yield from ((n, _decode(text, n)) for n, text in rest)


def dumps_line(obj: Any) -> str:
    """One JSON Lines line (with the trailing newline) for ``obj``; non-finite floats become ``null``."""
    try:
        return json.dumps(obj, allow_nan=False) + "\n"
    except ValueError:  # NaN / inf: strict JSON has no spelling for them
        return json.dumps(_finite(obj)) + "\n"


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_jsonl(records: Iterable[Any], destination: PathOrStream) -> int:
    """Write each record as one JSON line to ``destination``; return how many were written.

    Args:
        records: JSON-compatible objects (usually dicts).
        destination: a path (created or truncated), ``"-"`` for standard output,
            or an open text stream (left open, flushed).

    Raises:
        InputError: ``destination`` is a path that cannot be written.
    """
    own = not hasattr(destination, "write")
    stream: IO[str] = open_output(destination) if own else destination  # type: ignore[arg-type,assignment]
    count = 0
    try:
        for record in records:
            stream.write(dumps_line(record))
            count += 1
        stream.flush()
    finally:
        if own and stream is not sys.stdout:
            stream.close()
    return count


__all__ = ["Item", "PathOrStream", "dumps_line", "load_json_file", "load_json_object", "open_input", "open_output",
           "read_jsonl", "read_records", "write_jsonl"]


def load_json_file(path: str | os.PathLike[str]) -> Any:
    """The JSON value of a whole file.

    Raises:
        InputError: the file cannot be read or is not JSON; the message names the path (and the line).
    """
    try:
        with open(path, encoding="utf-8-sig") as fh:  # drops a leading byte-order mark (see open_input)
            text = fh.read()
    except OSError as exc:
        raise InputError(f"{_describe(path)}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{_describe(path)}: not UTF-8 text ({exc.reason})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{_describe(path)}: invalid JSON: {exc.msg} (line {exc.lineno})") from None


def load_json_object(path: str | os.PathLike[str], what: str, fmt: str | None = None,
                     version: Any = None) -> dict:
    """The JSON object of a file that describes ``what`` (a manifest or sidecar), checked.

    ``fmt``: the ``"format"`` the object must name; ``version``: its ``"format_version"``.

    Raises:
        InputError: unreadable or not JSON (:func:`load_json_file`), not an object, another format,
            or another format version; the message names the path.
    """
    data = load_json_file(path)
    if not isinstance(data, dict) or (fmt is not None and data.get("format") != fmt):
        raise InputError(f"{_describe(path)}: not a {what}")
    if version is not None and data.get("format_version") != version:
        raise InputError(f"{_describe(path)}: {what} format version {data.get('format_version')!r}; this "
                         f"learnedperf reads version {version}")
    return data
