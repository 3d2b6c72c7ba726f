"""The store package's shape: small modules, one home per statement, a narrow interface, and the
statements a worker's Session plans once marked where they are written."""

import ast
import importlib
import pkgutil
from pathlib import Path

import django_dbqueue.store as store
from django_dbqueue.connections import PlannedOnce

STORE = Path(store.__file__).parent
MODULES = sorted(STORE.glob("*.py"))


def assigned_names(path):
    tree = ast.parse(path.read_text())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Name):
                yield target.id


def test_every_store_module_stays_under_500_lines():
    sizes = {path.name: len(path.read_text().splitlines()) for path in MODULES}
    assert all(lines <= 500 for lines in sizes.values()), sizes


def test_each_statement_has_one_home():
    homes = {}
    for path in MODULES:
        for name in assigned_names(path):
            if name.isupper():
                homes.setdefault(name, []).append(path.name)
    assert {name: where for name, where in homes.items() if len(where) > 1} == {}


def test_only_the_claims_and_the_completion_are_planned_once():
    planned = set()
    for info in pkgutil.iter_modules(store.__path__):
        module = importlib.import_module(f"{store.__name__}.{info.name}")
        defined = set(assigned_names(STORE / f"{info.name}.py"))
        planned |= {
            f"{info.name}.{name}"
            for name, value in vars(module).items()
            if isinstance(value, PlannedOnce) and name in defined
        }
    assert planned == {
        "claiming.CLAIM_JOBS",
        "completion.COMPLETE_HELD_JOBS",
        "fair.CLAIM_FAIR",
        "fair.CLAIM_MORE_FAIR",
    }
    # Derived text (an EXPLAIN prefix, a replace()) is planned for its own values.
    assert type("EXPLAIN " + store.claiming.CLAIM_JOBS) is str


def test_the_interface_names_only_what_exists():
    assert all(hasattr(store, name) for name in store.__all__)
    assert len(set(store.__all__)) == len(store.__all__)


def test_no_store_module_imports_the_package_that_re_exports_it():
    """``from . import fair`` inside store/ imports store/__init__.py, which imports the module
    doing it: an import cycle. Modules of the package import each other by module name."""
    package_imports = {}
    for path in MODULES:
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None:
                package_imports.setdefault(path.name, []).extend(a.name for a in node.names)
    assert package_imports == {}
