"""The one JSON encoding of the documents kimictl prints or writes (reports, records, snapshots).

orjson: UTF-8, floats as Python prints them, NaN and infinities as null (JSON has neither), numpy
arrays and scalars as numbers, dataclasses and enums by value, non-string keys as strings, and
anything else (a Path, a set) as its `str`. Files go through `core.outputs`; this only encodes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["dumps"]


def dumps(doc: Any, *, indent: bool = True) -> bytes:
    """`doc` as JSON bytes ending in a newline: indented by 2 for people, or one line (`indent`
    False: a JSON-lines record, a file another tool reads)."""
    import orjson

    option = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE
    if indent:
        option |= orjson.OPT_INDENT_2
    return orjson.dumps(doc, option=option, default=str)
