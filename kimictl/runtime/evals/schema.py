"""A small, strict JSON Schema validator for the subset the structured-output check uses.

Supported keywords: type, properties, required, additionalProperties (bool), items, minItems,
maxItems, enum, const, minimum, maximum, minLength, maxLength. A schema using any other keyword is
rejected up front (`unsupported_keywords`), so validation is never silently laxer than the schema.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SUPPORTED_KEYWORDS", "unsupported_keywords", "validate"]

SUPPORTED_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "title",
        "description",
    }
)

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
    "number": (int, float),
    "integer": (int,),
}


def unsupported_keywords(schema: Any, path: str = "$") -> list[str]:
    """Keywords this validator does not implement, as 'path: keyword'."""
    found: list[str] = []
    if not isinstance(schema, dict):
        return [f"{path}: schema is not an object"]
    for key in schema:
        if key not in SUPPORTED_KEYWORDS:
            found.append(f"{path}: {key}")
    for name, sub in (schema.get("properties") or {}).items():
        found += unsupported_keywords(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found += unsupported_keywords(schema["items"], f"{path}[]")
    if "additionalProperties" in schema and not isinstance(schema["additionalProperties"], bool):
        found.append(f"{path}: additionalProperties (only true/false supported)")
    return found


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def validate(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Every violation of `schema` by `value`, as 'path: reason'; empty when valid."""
    errors: list[str] = []
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not any(_is_type(value, n) for n in names):
            return [f"{path}: expected {'|'.join(names)}, got {type(value).__name__}"]
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: expected {schema['const']!r}, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} > maximum {schema['maximum']}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{path}: length {len(value)} < minLength {schema['minLength']}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: length {len(value)} > maxLength {schema['maxLength']}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: {len(value)} items < minItems {schema['minItems']}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: {len(value)} items > maxItems {schema['maxItems']}")
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                errors += validate(item, schema["items"], f"{path}[{i}]")
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in value:
                errors.append(f"{path}: missing required {name!r}")
        for name, item in value.items():
            if name in props:
                errors += validate(item, props[name], f"{path}.{name}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unexpected property {name!r}")
    return errors
