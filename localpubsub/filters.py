"""Subscription filters: the attribute-only language of Pub/Sub's `filter` field.

Supported, as in the service: `attributes.KEY = "v"`, `attributes.KEY != "v"`,
`attributes:KEY`, `hasPrefix(attributes.KEY, "p")`, `NOT`/`-`, `AND`, `OR` and
parentheses; KEY is letters, digits, `_` and `-`, or a quoted string. Messages that do not match are acknowledged at
publish time, so subscribers never see them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from localpubsub.names import invalid

Predicate = Callable[[Mapping[str, str]], bool]

_TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<word>[A-Za-z0-9_][A-Za-z0-9_-]*)|(?P<op>!=|[=:(),.-]))')
_MAX_LENGTH = 256


def compile_filter(text: str) -> Predicate | None:
    """Parse a filter; None for the empty filter. Raises INVALID_ARGUMENT on bad syntax."""
    if not text.strip():
        return None
    if len(text.encode()) > _MAX_LENGTH:
        raise invalid(f"Filter is longer than {_MAX_LENGTH} bytes")
    return _Parser(text).parse()


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise invalid(f"Invalid filter near {text[pos:pos + 20]!r}")
        kind = match.lastgroup or "op"
        value = match.group(kind)
        if kind == "str":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        tokens.append((kind, value))
        pos = match.end()
    return tokens


class _Parser:
    """Recursive descent: or_expr := and_expr (OR and_expr)*; and_expr := unary (AND unary)*."""

    def __init__(self, text: str):
        self.tokens = _tokenize(text)
        self.pos = 0

    def parse(self) -> Predicate:
        predicate = self._or()
        if self.pos != len(self.tokens):
            raise invalid(f"Invalid filter: unexpected {self.tokens[self.pos][1]!r}")
        return predicate

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self, kind: str, value: str | None = None) -> str:
        token = self._peek()
        if token is None or token[0] != kind or (value is not None and token[1] != value):
            wanted = value or {"str": "a quoted string", "word": "a name"}[kind]
            raise invalid(f"Invalid filter: expected {wanted}, got {token[1] if token else 'the end'!r}")
        self.pos += 1
        return token[1]

    def _accept_word(self, word: str) -> bool:
        if self._peek() == ("word", word):
            self.pos += 1
            return True
        return False

    def _or(self) -> Predicate:
        parts = [self._and()]
        while self._accept_word("OR"):
            parts.append(self._and())
        return parts[0] if len(parts) == 1 else (lambda attrs: any(p(attrs) for p in parts))

    def _and(self) -> Predicate:
        parts = [self._unary()]
        while self._accept_word("AND"):
            parts.append(self._unary())
        return parts[0] if len(parts) == 1 else (lambda attrs: all(p(attrs) for p in parts))

    def _unary(self) -> Predicate:
        if self._accept_word("NOT") or self._peek() == ("op", "-") and self._take("op", "-"):
            inner = self._unary()
            return lambda attrs: not inner(attrs)
        if self._peek() == ("op", "("):
            self.pos += 1
            inner = self._or()
            self._take("op", ")")
            return inner
        if self._accept_word("hasPrefix"):
            self._take("op", "(")
            key = self._attribute()
            self._take("op", ",")
            prefix = self._take("str")
            self._take("op", ")")
            return lambda attrs: attrs.get(key, None) is not None and attrs[key].startswith(prefix)
        return self._comparison()

    def _attribute(self) -> str:
        self._take("word", "attributes")
        self._take("op", ".")
        return self._key()

    def _key(self) -> str:
        token = self._peek()
        if token is None or token[0] not in ("word", "str"):
            raise invalid("Invalid filter: expected an attribute key")
        self.pos += 1
        return token[1]

    def _comparison(self) -> Predicate:
        self._take("word", "attributes")
        if self._peek() == ("op", ":"):
            self.pos += 1
            key = self._key()
            return lambda attrs: key in attrs
        self._take("op", ".")
        key = self._key()
        token = self._peek()
        if token not in (("op", "="), ("op", "!=")):
            raise invalid("Invalid filter: expected = or != after an attribute")
        self.pos += 1
        value = self._take("str")
        if token[1] == "=":
            return lambda attrs: attrs.get(key) == value
        return lambda attrs: attrs.get(key) != value
