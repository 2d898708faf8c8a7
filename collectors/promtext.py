"""The samples of a Prometheus text exposition, as ``prometheus_client``'s parser reads them.

Every engine kind that serves ``/metrics`` (vLLM, SGLang, TensorRT-LLM, llama.cpp) is read
through :func:`samples`. ``prometheus_client.parser.text_string_to_metric_families`` (0.26.0,
``prometheus_client/parser.py``) walks each label value character by character: about 2 ms of
CPU for one vLLM scrape, every collection and every engine. Engines write plain lines (no
escapes, no quoted names, no blanks inside ``{...}``), which one regular expression reads in a
fraction of that. So :func:`samples` reads the text itself while every line has the plain form,
with the library's own rules for what a sample is called (a counter's family written without
``_total`` names its sample with it); at the first line of any other form it hands the whole
text to the library, which reads it, or refuses it with the library's own words.
"""

from __future__ import annotations

import re
from collections.abc import Container
from functools import lru_cache

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, dict[str, str], float]

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_PLAIN_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
# name, optional {labels} of plain pairs (a trailing comma allowed), value, optional timestamp.
_PLAIN_SAMPLE = re.compile(
    rf"({_NAME})(?:\{{((?:{_PLAIN_LABEL},)*(?:{_PLAIN_LABEL})?)\}})?[ \t]+(\S+)(?:[ \t]+-?\d+)?")
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\\n]*)"')
_FAMILY_NAME = re.compile(_NAME)
# The sample names each family type takes (the library's ``allowed_names``).
_SUFFIXES = {"counter": ("",), "gauge": ("",), "summary": ("_count", "_sum", ""),
             "histogram": ("_count", "_sum", "_bucket"), "untyped": ("",)}


class _NotPlain(Exception):
    """A line the plain reading does not take: the library reads the whole text instead."""


def samples(text: str, wanted: Container[str]) -> list[Sample]:
    """``(name, labels, value)`` of every sample in ``text`` whose name is in ``wanted``, in
    order. Raises ValueError, with the library's message, when ``text`` is not Prometheus
    text."""
    try:
        return _plain_samples(text, wanted)
    except _NotPlain:
        return [(sample.name, sample.labels, float(sample.value))
                for family in text_string_to_metric_families(text)
                for sample in family.samples if sample.name in wanted]


def _plain_samples(text: str, wanted: Container[str]) -> list[Sample]:
    found: list[Sample] = []
    family, kind, allowed = "", "untyped", ()
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            family, kind, allowed = _comment(line, family, kind, allowed)
            continue
        match = _PLAIN_SAMPLE.fullmatch(line)
        if match is None:
            raise _NotPlain
        name, labels_text, value_text = match.groups()
        if name in allowed:
            if kind == "counter" and not family.endswith("_total"):
                name += "_total"  # the library names a counter's sample so
        else:  # a sample of no declared family: the library makes it a family of its own
            family, kind, allowed = "", "untyped", ()
        if name not in wanted:
            continue
        labels = dict(_label_pairs(labels_text)) if labels_text else {}
        found.append((name, labels, _value(value_text)))
    return found


# An engine writes the same label sets and comments at every scrape (its model, engine, bucket
# bounds, help texts), so what they say is kept across reads, a few thousand of each at most: a
# label set found there costs a dict of its pairs, a fraction of reading it again. Refusals
# (_NotPlain) are not kept.
_KEPT = 4096


@lru_cache(maxsize=_KEPT)
def _label_pairs(labels_text: str) -> tuple[tuple[str, str], ...]:
    """The ``(name, value)`` pairs of the text inside a plain sample's braces."""
    pairs = tuple(_LABEL_PAIR.findall(labels_text))
    names = {name for name, _ in pairs}
    if "__name__" in names or len(names) != labels_text.count('="'):
        raise _NotPlain
    return pairs


@lru_cache(maxsize=_KEPT)
def _comment(line: str, family: str, kind: str,
             allowed: tuple[str, ...]) -> tuple[str, str, tuple[str, ...]]:
    """The family that a HELP or TYPE comment opens (other comments change nothing)."""
    if '"' in line or "\\" in line:
        raise _NotPlain
    parts = line.split(None, 3)
    if len(parts) < 2 or (len(parts) > 2 and parts[1] not in ("HELP", "TYPE")):
        return family, kind, allowed
    name = parts[2] if len(parts) > 2 else ""
    if name and not _FAMILY_NAME.fullmatch(name):
        raise _NotPlain
    if parts[1] == "HELP":
        return (family, kind, allowed) if name == family else (name, "untyped", (name,))
    if parts[1] != "TYPE":
        return family, kind, allowed
    if len(parts) < 4 or parts[3] not in _SUFFIXES:
        raise _NotPlain
    return name, parts[3], tuple(name + suffix for suffix in _SUFFIXES[parts[3]])


def _value(text: str) -> float:
    """A sample's value as the library reads it (an integer or a float; no underscores)."""
    if "_" in text:
        raise _NotPlain
    # int() never reads a point or an exponent: such a value (most of what engines write, "3.0")
    # goes straight to float() rather than through a raised ValueError first.
    if "." not in text and "e" not in text and "E" not in text:
        try:
            return float(int(text))
        except ValueError:
            pass
    try:
        return float(text)
    except ValueError:
        raise _NotPlain from None
