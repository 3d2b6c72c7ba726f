"""The package's metadata says what a user's install gets, and the code needs nothing more."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# Import name of each distribution the library may import unconditionally (asgiref comes with
# Django, which requires it).
IMPORT_NAMES = {
    "django": "Django",
    "asgiref": "Django",
    "psycopg": "psycopg",
    "croniter": "croniter",
}


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


def catches_import_error(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        for t in handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]:
            names.add(getattr(t, "id", None))
    return bool(names & {"ImportError", "ModuleNotFoundError"})


def unguarded_imports(statements: list[ast.stmt]) -> set[str]:
    """Top-level names imported whenever the module is imported.

    An optional extra's import is guarded: inside a ``try`` that catches ImportError, inside a
    function (imported when the feature is used) or under ``if TYPE_CHECKING``.
    """
    names: set[str] = set()
    for node in statements:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Try) and not catches_import_error(node):
            names |= unguarded_imports(node.body + node.orelse + node.finalbody)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            names |= unguarded_imports(node.body + node.orelse)
        elif isinstance(node, ast.ClassDef):
            names |= unguarded_imports(node.body)
    return names


def test_the_library_imports_only_its_dependencies():
    """django-environ and the test tools stay out of a user's install: nothing imports them."""
    required = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert {"django", "psycopg", "croniter"} <= required
    allowed = set(sys.stdlib_module_names) | {"django_dbqueue"}
    allowed |= {name for name, dist in IMPORT_NAMES.items() if dist.lower() in required}
    strays = {}
    for path in sorted((REPO / "django_dbqueue").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        extra = unguarded_imports(tree.body) - allowed
        if extra:
            strays[str(path.relative_to(REPO))] = sorted(extra)
    assert strays == {}, f"modules importing packages that are not dependencies: {strays}"


def test_django_environ_is_an_extra_not_a_dependency():
    required = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert "django-environ" not in required
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra in ("test", "example"):
        assert "django-environ" in {requirement_name(r) for r in extras[extra]}, extra


def test_license_file_and_backend_that_understands_the_expression():
    assert PYPROJECT["project"]["license"] == "MIT"
    for name in PYPROJECT["project"]["license-files"]:
        text = (REPO / name).read_text()
        assert text.startswith("MIT License")
        assert "django-dbqueue developers" in text
    # PEP 639's `license = "<SPDX expression>"` needs setuptools 77 or newer.
    (backend,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    major = int(re.search(r">=\s*(\d+)", backend).group(1))
    assert major >= 77, backend


def test_no_placeholder_urls_in_the_metadata_or_the_install_docs():
    """The project has no public home yet: the metadata names no URL rather than an invented one,
    and the install instructions say only what works today."""
    assert "urls" not in PYPROJECT["project"]
    for path in ("pyproject.toml", "README.md", "docs/quickstart.md", "docs/index.md"):
        text = (REPO / path).read_text()
        assert "example.invalid" not in text, path
        assert "<repository-url>" not in text and "git+" not in text, path


def test_the_django_versions_claimed_are_the_ones_ci_tests():
    """Classifiers, the dependency range and dev.py's test series name the same Django series."""
    from packaging.requirements import Requirement

    import dev

    tested = {series.key for series in dev.SERIES}
    assert tested == {"5.2", "6.1"}
    classifiers = {
        c.rsplit(" :: ", 1)[1]
        for c in PYPROJECT["project"]["classifiers"]
        if c.startswith("Framework :: Django :: ")
    }
    assert classifiers == tested
    (django,) = [
        Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("Django")
    ]
    for version in ("5.2", "5.2.19", "6.1", "6.1.3"):
        assert django.specifier.contains(version), (django, version)
    for version in ("5.1.9", "6.0", "6.0.5", "6.2", "7.0"):
        assert not django.specifier.contains(version), (django, version)
    for series in dev.SERIES:  # each test venv's pin lies inside the range
        pin = Requirement(series.requirement).specifier
        assert any(django.specifier.contains(v) and pin.contains(v) for v in ("5.2", "6.1"))


def test_the_install_docs_name_the_wheel_that_is_built():
    version = PYPROJECT["project"]["version"]
    for path in ("README.md", "docs/quickstart.md"):
        named = set(
            re.findall(r"django_dbqueue-([^-\s]+)-py3-none-any\.whl", (REPO / path).read_text())
        )
        assert named == {version}, (path, named)


def test_the_wheel_check_names_a_missing_file_and_a_stray_one(tmp_path):
    """dev.py's check of the built wheel: every file of the package in it, nothing else."""
    import zipfile

    import dev

    source = sorted(dev.package_files())
    assert "django_dbqueue/migrations/0001_initial.py" in source
    assert "django_dbqueue/py.typed" in source
    wheel = tmp_path / "django_dbqueue-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in source:
            archive.writestr(name, "")
        archive.writestr("django_dbqueue-1.0.dist-info/METADATA", "")
    assert dev.wheel_problems(wheel) == []

    template = "django_dbqueue/templates/admin/django_dbqueue/dashboard.html"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in source:
            if name not in (template, "django_dbqueue/py.typed"):
                archive.writestr(name, "")
        archive.writestr("tests/settings.py", "")
    assert dev.wheel_problems(wheel) == [
        "missing from the wheel: django_dbqueue/py.typed",
        f"missing from the wheel: {template}",
        "not part of the package: tests/settings.py",
        "the wheel has none of the py.typed marker (django_dbqueue/py.typed)",
    ]
