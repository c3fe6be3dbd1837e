"""Which names the files of a live Python tree import from the modules a push replaces.

Self-contained on purpose, like `_hashfiles.py`: kerneldev sends this source to the host and
runs it with the host's Python (request as JSON on stdin, answer as JSON on stdout), so one
remote command reads the whole tree; the local side imports the same functions to read the
files it is about to push. Standard library only, compatible with Python 3.6. Nothing is
imported or executed: files are parsed with `ast`.

A module's name comes from its path: the folder above the topmost package folder (one with
`__init__.py`) is the import root, and SGLang's `python/` always is one (newer SGLang trees use
namespace folders below it). The scan covers every `.py` file under the import roots of the
replaced files, except hidden folders and `__pycache__`, and finds, anywhere in a file (also
inside functions): `from M import a, b`, `from .rel import a`, `from P import m` (m the module
itself) and `import M` / `import M as x`, plus the attributes read from such a module object
(`x.name`, `M.name`).
"""

import ast
import json
import os
import sys

SKIP_DIRS = ("__pycache__", "node_modules")


def import_root(root, rel):
    """The import root (relative to root, "" for root itself) of the file `rel`."""
    parts = rel.split("/")[:-1]
    depth = len(parts)
    while depth > 0 and os.path.isfile(os.path.join(root, *parts[:depth], "__init__.py")):
        depth -= 1
    if parts and parts[0] == "python" and depth > 1:
        depth = 1  # SGLang: python/ is the import root, whatever the folders below hold
    return "/".join(parts[:depth])


def module_name(import_root_rel, rel):
    inner = rel[len(import_root_rel) + 1 :] if import_root_rel else rel
    name = inner[: -len(".py")].replace("/", ".")
    if name.endswith(".__init__"):
        name = name[: -len(".__init__")]
    return name


def _resolve(importer_module, is_package, level, module):
    """The absolute module a relative `from` import names (None when it leaves the tree)."""
    if not level:
        return module
    base = importer_module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        if level - 1 > len(base):
            return None
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def imports_of(source, importer_module, is_package, targets):
    """[(target module, name or None for the module itself, line)] that `source` needs."""
    tree = ast.parse(source)
    needs = []
    aliases = {}  # local dotted name bound to a target module -> that module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(importer_module, is_package, node.level or 0, node.module)
            if base is None:
                continue
            for alias in node.names:
                if base in targets:
                    if alias.name != "*":
                        needs.append((base, alias.name, node.lineno))
                    continue
                full = base + "." + alias.name
                if full in targets:
                    needs.append((full, None, node.lineno))
                    aliases[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in targets:
                    needs.append((alias.name, None, node.lineno))
                    aliases[alias.asname or alias.name] = alias.name
    if aliases:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                owner = _dotted(node.value)
                if owner in aliases:
                    needs.append((aliases[owner], node.attr, node.lineno))
    return needs


def _bind_target(target, names):
    if isinstance(target, ast.Name):
        names.add(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            _bind_target(elt, names)
    elif isinstance(target, ast.Starred):
        _bind_target(target.value, names)


def provided_names(source):
    """(names a module binds at its top level, open): `open` when it cannot be known statically
    (a `from x import *`, or a module-level `__getattr__`)."""
    names = set()
    is_open = False
    todo = list(ast.parse(source).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if node.name == "__getattr__":
                is_open = True
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                _bind_target(target, names)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            _bind_target(node.target, names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    is_open = True
                else:
                    names.add(alias.asname or alias.name)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            _bind_target(node.target, names)
            todo.extend(node.body + node.orelse)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    _bind_target(item.optional_vars, names)
            todo.extend(node.body)
        elif isinstance(node, (ast.If, ast.While)):
            todo.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            todo.extend(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                if handler.name:
                    names.add(handler.name)
                todo.extend(handler.body)
        elif type(node).__name__ == "Match":
            for case in node.cases:
                todo.extend(case.body)
    # A walrus at module level binds too; rare enough to read from the whole tree.
    return names, is_open


def scan(request):
    root = os.path.normpath(request["root"])
    targets = request["targets"]
    exclude = set(request.get("exclude", ()))
    modules = {}
    roots = set()
    for rel in targets:
        top = import_root(root, rel)
        roots.add(top)
        modules[rel] = {"module": module_name(top, rel), "import_root": top}
    wanted = set(m["module"] for m in modules.values())
    words = set(m.rsplit(".", 1)[-1] for m in wanted)
    result = {"modules": modules, "imports": [], "scanned": 0, "unparsable": []}
    seen = set()
    for top in sorted(roots):
        base = os.path.join(root, top) if top else root
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(
                d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS
            )
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
                if rel in exclude or rel in seen:
                    continue
                seen.add(rel)
                try:
                    with open(os.path.join(dirpath, name), "rb") as f:
                        data = f.read()
                except OSError:
                    continue
                result["scanned"] += 1
                # Cheap filter: a file that never spells a target's last name cannot import it.
                if not any(w.encode() in data for w in words):
                    continue
                importer = module_name(top, rel)
                try:
                    needs = imports_of(data, importer, name == "__init__.py", wanted)
                except (SyntaxError, ValueError):
                    result["unparsable"].append(rel)
                    continue
                for module, attr, line in needs:
                    result["imports"].append(
                        {"importer": rel, "module": module, "name": attr, "line": line}
                    )
    return result


def main():
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    sys.stdout.write(json.dumps(scan(request), ensure_ascii=True))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
