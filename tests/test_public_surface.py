"""Each module's `__all__` is its public surface: every name another kimictl module imports from
it is listed there, and every listed name exists there. Read from the sources (ast), so no
module is imported (but kernels.toolchain.build, for the list of kernel sources below).

The kernel families' own source files are exempt: `kernels.toolchain.build.source_hash()` hashes
their syntax trees, `__all__` included, into the build manifest, and a changed hash marks every
built kernel stale; so their `__all__` stays as the builds were made. Exactly the modules in some
family's `sources` (FAMILIES, LAYER_FAMILIES) are left out."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kimictl"


def _hashed() -> frozenset[str]:
    """The modules whose syntax trees a kernel build's source hash covers."""
    from kimictl.kernels.toolchain.build import FAMILIES, LAYER_FAMILIES

    families = [*FAMILIES.values(), *LAYER_FAMILIES.values()]
    return frozenset(module for fam in families for module in fam.sources)


HASHED = _hashed()


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text())
    return out


def _all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                assert isinstance(node.value, ast.List | ast.Tuple)
                return [ast.literal_eval(e) for e in node.value.elts]
    return None


def _bound(tree: ast.Module) -> set[str]:
    """Names a module binds at top level: definitions, assignments and imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _imports(modules: dict[str, ast.Module]) -> list[tuple[str, str, str]]:
    """(importer, module, name) for every `from kimictl.X import name` in the package."""
    found = []
    for importer, tree in modules.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.startswith("kimictl"):
                    found += [(importer, node.module, alias.name) for alias in node.names]
    return found


def test_every_imported_name_is_public_where_it_is_defined() -> None:
    modules = _modules()
    problems = []
    for importer, module, name in _imports(modules):
        if module in HASHED or name.startswith("_") or f"{module}.{name}" in modules:
            continue
        tree = modules[module]
        listed = _all(tree)
        if listed is None:
            problems.append(f"{module} has no __all__ ({importer} imports {name})")
        elif name not in listed:
            problems.append(f"{module}.__all__ lacks {name} ({importer} imports it)")
    assert problems == []


def test_every_listed_name_exists() -> None:
    problems = []
    for module, tree in _modules().items():
        listed = _all(tree) or []
        missing = set(listed) - _bound(tree)
        if missing and module not in HASHED:
            problems.append(f"{module}.__all__ names {sorted(missing)}, which it does not bind")
    assert problems == []
