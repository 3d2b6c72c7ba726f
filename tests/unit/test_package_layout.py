"""The package's shape (docs/code-map.md): no module over 500 lines, no import cycle between its
modules (lazy imports inside functions count), and none of Django's private connection hooks."""

import ast
import re
from pathlib import Path

import django_dbqueue

PACKAGE = Path(django_dbqueue.__file__).parent
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


NAMES = {module_name(p): p for p in MODULES}


def imported_modules(path):
    """The package's modules that ``path`` imports, at the top or inside a function."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # "from . import a, b" imports the modules a and b; "from .a import f" imports a.
            modules = {f"{target}.{alias.name}" for alias in node.names} & NAMES.keys()
            candidates = modules or {target}
        elif isinstance(node, ast.Import):
            candidates = {alias.name for alias in node.names}
        else:
            continue
        found |= {c for c in candidates if c in NAMES and c != name}
    return found


def find_cycle(graph):
    """One import cycle of ``graph`` as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_module_is_over_500_lines():
    sizes = {module_name(p): len(p.read_text().splitlines()) for p in MODULES}
    assert {name: n for name, n in sizes.items() if n > 500} == {}


def test_no_import_cycle_between_the_modules():
    graph = {name: imported_modules(path) for name, path in NAMES.items()}
    assert find_cycle(graph) is None


def test_the_cycle_finder_finds_a_cycle():
    # The test above is only worth something if a cycle would be found.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_private_hook_of_django_connections():
    # The wake-up used to wrap connection._commit and read connection.run_on_commit; both are
    # Django internals that can change in any release (docs/wakeups.md).
    private = re.compile(r"\._commit\b|\brun_on_commit\b")
    used = [module_name(p) for p in MODULES if private.search(p.read_text())]
    assert used == []


def test_every_name_taken_from_the_store_interface_exists():
    # The store's interface re-exports what the package uses: a name missing there fails only
    # where it is used (a process-mode child imports ClaimedRow lazily), so look for them all.
    import django_dbqueue.store as store

    missing = set()
    for path in MODULES:
        if "store" in path.relative_to(PACKAGE).parts[:-1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("store"):
                if node.module in ("store", "django_dbqueue.store") or node.level:
                    names = [alias.name for alias in node.names]
                    missing |= {f"{module_name(path)}: {n}" for n in names if not hasattr(store, n)}
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "store"
                and not hasattr(store, node.attr)
            ):
                missing.add(f"{module_name(path)}: store.{node.attr}")
    assert missing == set()
