"""The DOT writer ``to_dot`` uses: the same text as the ``graphviz`` library's ``Digraph`` (which stays the reference
in the tests), without its per-call checks, which were most of the time of a large drawing's DOT."""

from __future__ import annotations

import re

import graphviz

_ID = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*|-?(\.[0-9]+|[0-9]+(\.[0-9]*)?))$")
_HTML = re.compile(r"<.*>$", re.DOTALL)
_UNESCAPED_QUOTE = re.compile(r'(?P<pairs>(?:\\{2})*)\\?(?P<quote>")')
_KEYWORDS = {"node", "edge", "graph", "digraph", "subgraph", "strict"}
_NoHtml = type(graphviz.nohtml(""))


def _quote(text: str) -> str:
    """``graphviz.quoting.quote``, the same bytes for every input, without its per-call argument checks
    (they were most of the time of a large drawing's DOT)."""
    if text.isidentifier() and text.isascii():  # an ASCII name such as n12 (what _ID's first branch matches)
        return '"' + text + '"' if text.lower() in _KEYWORDS else text
    if text[:1] == "<" and (text[-1:] == ">" or text[-2:] == ">\n") and not isinstance(text, _NoHtml) \
            and _HTML.match(text):
        return text
    if not _ID.match(text) or text.lower() in _KEYWORDS:
        return '"' + (_UNESCAPED_QUOTE.sub(r"\g<pairs>\\\g<quote>", text) if '"' in text else text) + '"'
    return text


def _quote_text(text: str) -> str:
    """``_quote`` of ``graphviz.nohtml(text)``: never read as an HTML-like label."""
    if not _ID.match(text) or text.lower() in _KEYWORDS:
        return '"' + (_UNESCAPED_QUOTE.sub(r"\g<pairs>\\\g<quote>", text) if '"' in text else text) + '"'
    return text


_QUOTED: dict[str, str] = {}  # attribute names and short values repeat on every node: quoted once
_PAIRS: dict[tuple[str, str], str] = {}


def _quote_short(text: str) -> str:
    if len(text) > 40 or isinstance(text, _NoHtml):
        return _quote(text)
    quoted = _QUOTED.get(text)
    if quoted is None:
        if len(_QUOTED) > 100_000:
            _QUOTED.clear()
        quoted = _QUOTED[text] = _quote(text)
    return quoted


class _Digraph:
    """The part of ``graphviz.Digraph`` that ``to_dot`` uses, writing the same DOT text (``label`` first,
    then the other attributes sorted, as the library does).  Subgraphs (the legend) are left to the library."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.body: list[str] = []

    @staticmethod
    def _attributes(label: str | None, attributes: dict) -> str:
        parts = [f"label={_quote(label)}"] if label is not None else []
        for key in sorted(attributes):
            value = attributes[key]
            if value is None:
                continue
            # ``key=value`` repeats on every node (shape=box, id=n12 …): written once.  Only plain ``str``
            # values share the cache: a ``nohtml`` value is quoted differently from the same text as ``str``.
            plain = type(value) is str and len(value) <= 40
            pair = _PAIRS.get((key, value)) if plain else None
            if pair is None:
                pair = f"{_quote_short(key)}={_quote_short(value)}"
                if plain:
                    if len(_PAIRS) > 100_000:
                        _PAIRS.clear()
                    _PAIRS[(key, value)] = pair
            parts.append(pair)
        return " ".join(parts)

    def attr(self, kw: str | None = None, **attributes: str) -> None:
        listed = self._attributes(None, attributes)
        self.body.append(f"\t{listed}\n" if kw is None else f"\t{kw} [{listed}]\n")

    def node(self, name: str, label: str | None = None, **attributes: str) -> None:
        listed = self._attributes(label, attributes)
        self.body.append(f"\t{_quote_short(name)} [{listed}]\n" if listed else f"\t{_quote_short(name)}\n")

    def edge(self, tail: str, head: str, label: str | None = None, **attributes: str) -> None:
        listed = self._attributes(label, attributes)
        self.body.append(f"\t{_quote_short(tail)} -> {_quote_short(head)}{f' [{listed}]' if listed else ''}\n")

    def subgraph(self, name: str):
        return _LibrarySubgraph(self, name)

    @property
    def source(self) -> str:
        return f"digraph {_quote(self.name)} {{\n" + "".join(self.body) + "}\n"


_cluster_attributes = _Digraph._attributes  # also used when the library writes the rest (tests compare both)


class _LibrarySubgraph:
    """``with dot.subgraph(name=...) as sub:`` drawn by the graphviz library, its lines added to ``dot``."""

    def __init__(self, parent: _Digraph, name: str) -> None:
        self.parent, self.library = parent, graphviz.Digraph(name="autograd")
        self.context = self.library.subgraph(name=name)

    def __enter__(self):
        return self.context.__enter__()

    def __exit__(self, *exc):
        result = self.context.__exit__(*exc)
        self.parent.body.extend(self.library.body)
        return result
