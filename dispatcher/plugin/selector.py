"""`-l/--selector` of `kubectl aw`: a label selector checked before it is sent, so a mistake
is named in one line (what is wrong, and where) instead of the API server's parser's words.
The grammar is the API server's (apimachinery `labels.Parse`): requirements joined by commas,
each `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)`,
`key notin (v1,v2)`, `key>N` or `key<N`; keys are qualified names (an optional DNS-subdomain
prefix and `/`), values label values (63 characters at most, may be empty). Pure.
"""

from __future__ import annotations

import re

from dispatcher.plugin.errors import PluginError

_TOKEN = re.compile(r"!=|==|=|!|<|>|\(|\)|,|[^\s,()=!<>]+")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_OPERATORS = ("=", "==", "!=", "in", "notin", ">", "<")
_SYMBOLS = ("!=", "==", "=", "!", "<", ">", "(", ")", ",")


class _Tokens:
    def __init__(self, text: str) -> None:
        self.items: list[str] = _TOKEN.findall(text)
        self.at = 0

    def peek(self) -> str | None:
        return self.items[self.at] if self.at < len(self.items) else None

    def take(self) -> str | None:
        token = self.peek()
        self.at += token is not None
        return token


def check_selector(text: str) -> str:
    """`text` if it is a label selector the API server accepts; PluginError naming the
    mistake otherwise."""
    try:
        _requirements(_Tokens(text))
    except PluginError as exc:
        raise PluginError(f"invalid selector {text!r}: {exc}") from None
    return text


def _requirements(tokens: _Tokens) -> None:
    while True:
        _requirement(tokens)
        after = tokens.take()
        if after is None:
            return
        if after != ",":
            raise PluginError(f"expected ',' or the end, found {_shown(after)}")


def _requirement(tokens: _Tokens) -> None:
    first = tokens.take()
    if first == "!":
        _key(tokens.take())
        return
    _key(first)
    operator = tokens.peek()
    if operator is None or operator == ",":
        return  # `key`: the label exists
    tokens.take()
    if operator not in _OPERATORS:
        raise PluginError(
            f"expected an operator (=, ==, !=, in, notin, >, <), found {_shown(operator)}"
        )
    if operator in ("in", "notin"):
        if tokens.take() != "(":
            raise PluginError(f"expected '(' after {operator!r}")
        while True:
            token = tokens.take()
            if token == ")":  # `in ()` and `in (a,)`: the empty value, as the API server reads it
                return
            if token == ",":
                continue
            _value(token)
            closing = tokens.take()
            if closing == ")":
                return
            if closing != ",":
                raise PluginError(f"expected ',' or ')' in the values of {operator!r}")
    value = tokens.peek()
    if value is None or value == ",":
        if operator in (">", "<"):
            raise PluginError(f"{operator!r} needs a number")
        return  # `key=`: the label is empty
    tokens.take()
    if operator in (">", "<"):
        if not re.fullmatch(r"-?[0-9]+", value):
            raise PluginError(f"{operator!r} needs a whole number, found {value!r}")
        return
    _value(value)


def _key(token: str | None) -> None:
    if token is None or token in _SYMBOLS:
        raise PluginError(f"expected a label key, found {_shown(token)}")
    prefix, _, name = token.rpartition("/")
    if "/" in token and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.fullmatch(prefix)):
        raise PluginError(f"the prefix of key {token!r} is not a DNS subdomain")
    if len(name) > 63 or not _NAME.fullmatch(name):
        raise PluginError(
            f"key {token!r}: a name of 63 characters at most, alphanumerics with '-', '_'"
            " or '.' between them"
        )


def _value(token: str | None) -> None:
    if token is None or token in _SYMBOLS:
        raise PluginError(f"expected a value, found {_shown(token)}")
    if len(token) > 63 or not _NAME.fullmatch(token):
        raise PluginError(
            f"value {token!r}: 63 characters at most, alphanumerics with '-', '_' or '.'"
            " between them"
        )


def _shown(token: str | None) -> str:
    return "the end" if token is None else repr(token)
