"""Read a DeepSpeed config file the way DeepSpeed does, keeping a line/column for every value.

DeepSpeed loads config files with hjson, so ``//``, ``#`` and ``/* */`` comments and trailing
commas are accepted, and a duplicate key anywhere in the file is rejected
(``dict_raise_error_on_duplicate_keys``). Real configs use nothing else from hjson (no quoteless
strings or keys), so this is a small hand-written JSON parser with exactly those relaxations: it
needs no dependency, reports ``file:line:col`` on syntax errors, and records the position of every
JSON pointer so findings can point at the offending line.

Duplicate keys are not a syntax error here: they are returned in :attr:`LoadedConfig.duplicates`
so the validator can report them as findings next to everything else. The last value wins, as in
``json.loads`` (DeepSpeed refuses the file).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsgen.errors import DsgenError
from dsgen.inputs import read_bytes
from dsgen.validate.jsontypes import escape_pointer_token

Position = tuple[int, int]

# One pattern for every token; whitespace and the three comment styles hjson accepts are "skip".
_TOKEN = re.compile(
    r"""(?P<skip>(?:[ \t\r\n\ufeff]+|//[^\n]*|\#[^\n]*|/\*.*?\*/)+)"""
    r"""|(?P<str>"(?:[^"\\\x00-\x1f]|\\.)*")"""
    r"""|(?P<num>-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?)"""
    r"""|(?P<punct>[{}\[\]:,])"""
    r"""|(?P<lit>true|false|null)""",
    re.DOTALL,
)
#: Longest integer literal read (DeepSpeed's values fit in 64 bits, 20 digits; Python itself
#: refuses to convert more than 4,300 digits).
MAX_INTEGER_DIGITS = 100
_LITERALS = {"true": True, "false": False, "null": None}
_END = ("end", "", -1)


class ConfigSyntaxError(DsgenError):
    """Invalid JSON; the message starts with ``file:line:col`` and ``line``/``column`` are kept."""

    def __init__(
        self, message: str, *, line: int | None = None, column: int | None = None, hint: str | None = None
    ) -> None:
        self.line = line
        self.column = column
        super().__init__(message, hint=hint)


@dataclass(frozen=True)
class Duplicate:
    """A key that appears twice in one object: where it is now and where it was first."""

    pointer: str
    line: int
    column: int
    first_line: int
    first_column: int


@dataclass
class LoadedConfig:
    """The parsed value plus the source positions the validator reports against."""

    data: Any
    positions: dict[str, Position] = field(default_factory=dict)
    duplicates: list[Duplicate] = field(default_factory=list)


class _Parser:
    """Tokenise with one regex, then recursive descent; positions stay offsets until the end."""

    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.offsets: dict[str, int] = {}
        self.duplicates: list[tuple[str, int, int]] = []
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.tokens = self._tokenize()
        self.i = 0

    # -- positions -------------------------------------------------------------------------
    def line_col(self, offset: int) -> Position:
        line = bisect_right(self._line_starts, offset)
        return line, offset - self._line_starts[line - 1] + 1

    def fail(self, message: str, offset: int) -> ConfigSyntaxError:
        line, col = self.line_col(offset if offset >= 0 else len(self.text))
        return ConfigSyntaxError(
            f"{self.source}:{line}:{col}: invalid JSON: {message}",
            line=line,
            column=col,
            hint="DeepSpeed accepts strict JSON plus // # /* */ comments and trailing commas",
        )

    # -- lexing ----------------------------------------------------------------------------
    def _tokenize(self) -> list[tuple[str, str, int]]:
        text, tokens, pos, end = self.text, [], 0, len(self.text)
        match = _TOKEN.match
        while pos < end:
            found = match(text, pos)
            if found is None:
                raise self.fail(self._bad_char(pos), pos)
            kind = found.lastgroup
            if kind != "skip":
                tokens.append((kind, found.group(), pos))
            pos = found.end()
        tokens.append(_END)
        return tokens  # type: ignore[return-value]

    def _bad_char(self, pos: int) -> str:
        if self.text.startswith("/*", pos):
            return "unterminated /* comment"
        if self.text[pos] == '"':
            return "unterminated string, or a control character inside a string"
        word = re.match(r"[^\s,:\]\}\[\{]{1,30}", self.text[pos:])
        return f"unexpected {word.group(0) if word else self.text[pos]!r}"

    @staticmethod
    def _describe(token: tuple[str, str, int]) -> str:
        return "end of file" if token[0] == "end" else repr(token[1])

    def _string(self, token: tuple[str, str, int]) -> str:
        raw = token[1]
        if "\\" not in raw:
            return raw[1:-1]
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise self.fail(f"bad escape in string ({exc.msg})", token[2]) from None

    # -- grammar ---------------------------------------------------------------------------
    def value(self, pointer: str) -> Any:
        token = self.tokens[self.i]
        self.i += 1
        kind, text, offset = token
        if kind == "punct":
            if text == "{":
                return self.obj(pointer)
            if text == "[":
                return self.array(pointer)
        elif kind == "str":
            return self._string(token)
        elif kind == "num":
            if "." not in text and "e" not in text and "E" not in text:
                if len(text) > MAX_INTEGER_DIGITS:
                    raise self.fail(f"integer of {len(text)} digits is out of range", offset)
                return int(text)
            number = float(text)
            if number in (float("inf"), float("-inf")):
                raise self.fail(f"number {text} is out of range", offset)
            return number
        elif kind == "lit":
            return _LITERALS[text]
        raise self.fail(f"expected a value, found {self._describe(token)}", offset)

    def obj(self, pointer: str) -> dict[str, Any]:
        result: dict[str, Any] = {}
        # Where each duplicated key of *this* object first appeared. ``offsets`` moves on to the
        # latest occurrence (the value that wins), so from the third occurrence on it no longer
        # holds the first; kept per object, as a later object can reuse the same pointer.
        firsts: dict[str, int] = {}
        tokens, offsets = self.tokens, self.offsets
        while True:
            token = tokens[self.i]
            if token[1] == "}" and token[0] == "punct":
                self.i += 1
                return result
            if token[0] != "str":
                raise self.fail(f"expected a quoted key or '}}', found {self._describe(token)}", token[2])
            key = self._string(token)
            child = f"{pointer}/{escape_pointer_token(key)}" if ("/" in key or "~" in key) else f"{pointer}/{key}"
            if key in result:
                self.duplicates.append((child, token[2], firsts.setdefault(key, offsets[child])))
            offsets[child] = token[2]
            colon = tokens[self.i + 1]
            if colon[1] != ":" or colon[0] != "punct":
                raise self.fail(f"expected ':' after key {key!r}, found {self._describe(colon)}", colon[2])
            self.i += 2
            result[key] = self.value(child)
            token = tokens[self.i]
            if token[0] == "punct" and token[1] == ",":
                self.i += 1
            elif not (token[0] == "punct" and token[1] == "}"):
                raise self.fail(
                    f"expected ',' or '}}' after the value of {key!r}, found {self._describe(token)}", token[2]
                )

    def array(self, pointer: str) -> list[Any]:
        result: list[Any] = []
        tokens = self.tokens
        while True:
            token = tokens[self.i]
            if token[0] == "punct" and token[1] == "]":
                self.i += 1
                return result
            child = f"{pointer}/{len(result)}"
            self.offsets[child] = token[2]
            result.append(self.value(child))
            token = tokens[self.i]
            if token[0] == "punct" and token[1] == ",":
                self.i += 1
            elif not (token[0] == "punct" and token[1] == "]"):
                raise self.fail(f"expected ',' or ']' in the list, found {self._describe(token)}", token[2])

    def document(self) -> LoadedConfig:
        first = self.tokens[0]
        if first[0] == "end":
            raise self.fail("the file is empty", 0)
        self.offsets[""] = first[2]
        data = self.value("")
        rest = self.tokens[self.i]
        if rest[0] != "end":
            raise self.fail(f"unexpected {self._describe(rest)} after the end of the document", rest[2])
        positions = {pointer: self.line_col(offset) for pointer, offset in self.offsets.items()}
        duplicates = [
            Duplicate(pointer, *self.line_col(offset), *self.line_col(first))
            for pointer, offset, first in self.duplicates
        ]
        return LoadedConfig(data, positions, duplicates)


def loads(text: str, source: str = "<string>") -> LoadedConfig:
    """Parse config text; raise :class:`DsgenError` with ``source:line:col`` on bad syntax."""
    try:
        return _Parser(text, source).document()
    except RecursionError:
        raise DsgenError(f"{source}: invalid JSON: nesting is too deep") from None


def load(path: str | Path) -> LoadedConfig:
    """Read and parse a config file; unreadable or undecodable files raise :class:`DsgenError`."""
    source = str(path)
    try:
        raw = read_bytes(path, "")
    except DsgenError as exc:  # not a regular file, too large, unreadable
        raise DsgenError(f"{source}: {exc.message}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DsgenError(f"{source}: file is not UTF-8 text (byte {exc.start})") from None
    return loads(text, source)
