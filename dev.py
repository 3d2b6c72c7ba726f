#!/usr/bin/env python3
"""Developer and CI entry point for django-dbqueue.

Runs with a bare ``python3`` (3.11 or newer) and the standard library only: everything
else (Django, psycopg, pytest, ruff, mkdocs, pgserver) lives in virtualenvs that this
script creates under ``.venvs/``.

    python3 dev.py test [--fast] [--django 5.2|6.1] [--recreate] [pytest args...]
    python3 dev.py demo [--drop] [--serve] [shop_demo args]   # the example shop, in its own database
    python3 dev.py bench [bench args]   # benchmarks/bench.py

What ``test`` does:

1. Builds (or reuses) one virtualenv per supported Django series:
   ``.venvs/django52`` (Django 5.2 on Python 3.11, or the running Python) and
   ``.venvs/django61`` (Django 6.1 on Python >= 3.12, skipped when no such Python exists).
   Each gets ``pip install -e .[test,lint,docs,dist]`` plus the pinned Django series. A venv is
   reinstalled only when pyproject.toml (or this recipe) changes: see ``.dbqueue-stamp``.
2. Finds a PostgreSQL server:
   ``$DATABASE_URL`` if set; else a local server on 127.0.0.1:5432 or the Unix sockets in
   /var/run/postgresql and /tmp (users ``postgres``, then the OS user; database ``postgres``);
   else an embedded PostgreSQL 16 from the ``pgserver`` package, with its data in
   ``.dbqueue-pgdata/``. ``DBQUEUE_EMBEDDED=1`` forces the embedded server.
   Every candidate URL is parsed with django-environ and connected to before it is used.
3. Runs ruff check, ruff format --check, makemigrations --check and (when mkdocs.yml
   exists) mkdocs build --strict in the Django 5.2 venv; builds the sdist and the wheel
   (``python -m build``), checks them (``twine check --strict``) and checks that the wheel holds
   every file of the package and nothing else; then pytest in every venv. Last, for each
   series, it installs the wheel into a fresh venv (``.venvs/wheel-django52``, ...) and runs
   tests/acceptance/test_quickstart.py with that venv's Python running the quickstart project.
   ``--fast`` skips all but pytest.
   Every step runs even if an earlier one failed; a summary table is printed at the end and
   the exit status is non-zero if any step failed.

What ``demo`` does: builds ``.venvs/demo`` with only what the example project runs (the package,
Django 5.2, psycopg, django-environ: ``pip install -e .[example]``), finds a server as above,
creates the database ``dbqueue_demo`` on it (marked with a comment, so that dev.py never touches
a database it did not create), migrates it and runs ``shop_demo``. The database is kept for a
look with the admin: dev.py makes a superuser ``admin`` with a new random password, prints it and
prints the command that serves the project with the demo venv's Python; ``--serve`` serves it
right away until Ctrl-C; ``--drop`` drops the database when the demo is done.

Environment knobs: ``DATABASE_URL``, ``DBQUEUE_EMBEDDED=1``, ``DBQUEUE_NO_UV=1`` (install
with plain pip instead of uv).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent
VENVS = REPO / ".venvs"
PGDATA = REPO / ".dbqueue-pgdata"
STAMP_NAME = ".dbqueue-stamp"
EXTRAS = "test,lint,docs,dist"
DEMO_EXTRAS = "example"
DEMO_DATABASE = "dbqueue_demo"
# COMMENT ON DATABASE of the demo's database: dev.py drops or reuses only a database with it.
DEMO_MARKER = "created by django-dbqueue's dev.py demo; safe to drop"
PGSERVER_SPEC = "pgserver>=0.1.4"  # same as the [embedded] extra in pyproject.toml
# Bump when the install recipe below changes, so existing venvs get rebuilt.
RECIPE_VERSION = "1"

MIN_PYTHON = (3, 11)
if sys.version_info < MIN_PYTHON:
    sys.exit(f"dev.py needs Python >= 3.11 (this is {sys.version.split()[0]})")


@dataclass(frozen=True)
class Series:
    """One supported Django series and the virtualenv that tests it."""

    key: str  # "5.2"
    venv_name: str  # "django52"
    requirement: str  # "Django>=5.2,<6.0"
    min_python: tuple[int, int]
    python_candidates: tuple[str, ...]
    extras: str = EXTRAS
    purpose: str = ""  # "demo" for the demo's venv; empty for a test venv

    @property
    def label(self) -> str:
        return f"Django {self.key}" + (f" ({self.purpose})" if self.purpose else "")

    @property
    def venv(self) -> Path:
        return VENVS / self.venv_name


SERIES = (
    Series("5.2", "django52", "Django>=5.2,<6.0", (3, 11), ("python3.11",)),
    Series(
        "6.1", "django61", "Django>=6.1,<6.2", (3, 12), ("python3.12", "python3.13", "python3.14")
    ),
)
# The demo runs the example project only: no test, lint or docs tools in its venv.
DEMO_SERIES = Series(
    "5.2", "demo", "Django>=5.2,<6.0", (3, 11), ("python3.11",), DEMO_EXTRAS, "demo"
)


def say(msg: str) -> None:
    """Print one line of dev.py's own output (as opposed to a tool's)."""
    print(f"dev.py: {msg}", flush=True)


def venv_bin(venv: Path, name: str) -> Path:
    scripts = "Scripts" if os.name == "nt" else "bin"
    suffix = ".exe" if os.name == "nt" else ""
    return venv / scripts / f"{name}{suffix}"


# --------------------------------------------------------------------------------------
# Finding interpreters
# --------------------------------------------------------------------------------------

_PY_INFO = "import sys; print(sys.executable); print(*sys.version_info[:3])"


def interpreter_info(candidate: str) -> tuple[str, tuple[int, int, int]] | None:
    """Return (real executable, version) for a python command, or None if it doesn't run.

    pyenv shims exist on PATH even when the version behind them is not active, so merely
    finding the name is not enough: it has to run.
    """
    try:
        out = subprocess.run(
            [candidate, "-c", _PY_INFO],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split("\n")
        version = tuple(int(p) for p in out[1].split())
        return out[0].strip(), version  # type: ignore[return-value]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def pyenv_pythons(name: str) -> list[str]:
    """Interpreters called ``name`` installed by pyenv but not activated on PATH."""
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    versions = Path(root) / "versions"
    if not versions.is_dir():
        return []
    found = sorted(versions.glob(f"*/bin/{name}"), reverse=True)
    return [str(p) for p in found if p.is_file()]


def find_python(series: Series) -> tuple[str, tuple[int, int, int]] | None:
    """Pick the interpreter for a series' venv."""
    candidates: list[str] = []
    for name in series.python_candidates:
        if shutil.which(name):
            candidates.append(name)
    if sys.version_info[:2] >= series.min_python:
        candidates.append(sys.executable)
    for name in series.python_candidates:
        candidates.extend(pyenv_pythons(name))
    for cand in candidates:
        info = interpreter_info(cand)
        if info and info[1][:2] >= series.min_python:
            return info
    return None


# --------------------------------------------------------------------------------------
# Virtualenvs
# --------------------------------------------------------------------------------------


def needs_psycopg_binary() -> bool:
    """psycopg's pure-Python build needs the system libpq; fall back to the binary wheel."""
    import ctypes.util

    return ctypes.util.find_library("pq") is None


def install_requirements(series: Series) -> list[str]:
    reqs = ["-e", f".[{series.extras}]", series.requirement]
    if needs_psycopg_binary():
        reqs.append("psycopg[binary]")
    return reqs


def stamp_for(series: Series, python: str, version: tuple[int, int, int]) -> str:
    h = hashlib.sha256()
    h.update((REPO / "pyproject.toml").read_bytes())
    h.update(json.dumps([RECIPE_VERSION, python, version, install_requirements(series)]).encode())
    return h.hexdigest()


def find_uv() -> Path | None:
    """A uv binary: on PATH, or one that dev.py installed into an earlier venv."""
    on_path = shutil.which("uv")
    if on_path:
        return Path(on_path)
    for s in (*SERIES, DEMO_SERIES):
        cand = venv_bin(s.venv, "uv")
        if cand.exists():
            return cand
    return None


def run_quiet_ok(cmd: list[str], **kw) -> bool:
    print("  $ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=False, **kw).returncode == 0


def pip_install(venv: Path, args: list[str]) -> bool:
    """Install into ``venv``: with uv when available (much faster), else with pip."""
    py = venv_bin(venv, "python")
    if not os.environ.get("DBQUEUE_NO_UV"):
        uv = find_uv()
        # Bootstrapping uv costs one small wheel and pays back on every install.
        if uv is None and run_quiet_ok([str(py), "-m", "pip", "install", "--quiet", "uv"]):
            uv = venv_bin(venv, "uv")
        if uv is not None and uv.exists():
            if run_quiet_ok([str(uv), "pip", "install", "--python", str(py), *args], cwd=REPO):
                return True
            say("uv failed; retrying with pip")
    return run_quiet_ok([str(py), "-m", "pip", "install", "--quiet", *args], cwd=REPO)


def ensure_venv(series: Series, recreate: bool = False) -> Path | None:
    """Create or refresh the venv for ``series``; None when no suitable Python exists."""
    found = find_python(series)
    if found is None:
        return None
    python, version = found
    venv = series.venv
    stamp_file = venv / STAMP_NAME
    stamp = stamp_for(series, python, version)
    py = venv_bin(venv, "python")
    up_to_date = stamp_file.exists() and stamp_file.read_text().strip() == stamp
    if up_to_date and not recreate and interpreter_info(str(py)):
        say(f"{series.label}: reusing {venv.relative_to(REPO)} (Python {fmt(version)})")
        return venv
    started = time.monotonic()
    marker = venv / ".dbqueue-python"  # which interpreter the venv was made from
    same_python = marker.exists() and marker.read_text() == python and interpreter_info(str(py))
    if recreate or not same_python:
        say(f"{series.label}: creating {venv.relative_to(REPO)} with {python} ({fmt(version)})")
        VENVS.mkdir(exist_ok=True)
        if subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=False).returncode:
            raise SystemExit(
                f"dev.py: could not create a venv with {python}; on Debian/Ubuntu install "
                "the python3-venv package"
            )
        marker.write_text(python)
    else:
        say(f"{series.label}: pyproject.toml changed, reinstalling into {venv.relative_to(REPO)}")
    stamp_file.unlink(missing_ok=True)
    if not pip_install(venv, install_requirements(series)):
        raise SystemExit(f"dev.py: installing into {venv} failed (see the output above)")
    stamp_file.write_text(stamp + "\n")
    say(f"{series.label}: venv ready in {time.monotonic() - started:.1f}s")
    return venv


def fmt(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version)


# --------------------------------------------------------------------------------------
# Finding a database
# --------------------------------------------------------------------------------------

# Runs inside a venv: parses each URL exactly as tests/settings.py does (django-environ's
# env.db()) and connects with the same parameters Django would pass to psycopg.
_CONNECT_KW = r"""
import environ

def connect_kw(url):
    cfg = environ.Env.db_url_config(url)
    kw = {"dbname": cfg.get("NAME") or "postgres", "connect_timeout": 3}
    for key, name in (("HOST", "host"), ("PORT", "port"), ("USER", "user"),
                      ("PASSWORD", "password")):
        if cfg.get(key):
            kw[name] = str(cfg[key])
    kw.update(cfg.get("OPTIONS") or {})
    return kw
"""

_PROBE = (
    _CONNECT_KW
    + r"""
import json, sys
import psycopg
for url in json.loads(sys.argv[1]):
    try:
        with psycopg.connect(**connect_kw(url)) as conn:
            version = conn.execute("show server_version").fetchone()[0]
        print(json.dumps({"url": url, "version": version}), flush=True)
        sys.exit(0)
    except Exception as exc:
        print(json.dumps({"url": url, "error": str(exc).strip()}), flush=True)
sys.exit(1)
"""
)

# Runs inside a venv: creates (or finds) the demo's database, or drops it. It touches only a
# database that carries DEMO_MARKER as its comment, and connects to the server's database named
# in the URL (``postgres`` when the URL names the demo's database itself). Prints one word:
# created, reused, dropped or absent; or an error and exits 1.
_DEMO_DB = (
    _CONNECT_KW
    + r"""
import sys
import psycopg
from psycopg import sql
url, name, action, marker = sys.argv[1:5]
kw = connect_kw(url)
if kw["dbname"] == name:
    kw["dbname"] = "postgres"
ident = sql.Identifier(name)
try:
    with psycopg.connect(**kw, autocommit=True) as conn:
        row = conn.execute(
            "select shobj_description(oid, 'pg_database') from pg_database where datname = %s",
            [name],
        ).fetchone()
        if row is not None and row[0] != marker:
            sys.exit(f"a database called {name} exists and was not made by dev.py demo; "
                     "dev.py leaves it alone: drop or rename it yourself")
        if action == "create" and row is None:
            conn.execute(sql.SQL("create database {}").format(ident))
            conn.execute(sql.SQL("comment on database {} is {}").format(ident, sql.Literal(marker)))
            print("created")
        elif action == "create":
            print("reused")
        elif row is None:
            print("absent")
        else:
            conn.execute(sql.SQL("drop database {} with (force)").format(ident))
            print("dropped")
except psycopg.Error as exc:
    sys.exit(f"could not {action} the database {name}: {str(exc).strip()}")
"""
)

# Runs inside a venv: starts pgserver, prints its URI, and keeps it up until stdin closes
# (dev.py closes it when done; if dev.py dies, the pipe closes and the server stops too).
_EMBEDDED = r"""
import sys, warnings
warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
import pgserver
server = pgserver.get_server(sys.argv[1], cleanup_mode="stop")
print(server.get_uri(), flush=True)
sys.stdin.read()
"""


@dataclass
class Database:
    url: str
    description: str
    server: subprocess.Popen | None = field(default=None, repr=False)

    def close(self) -> None:
        if self.server is None:
            return
        if self.server.stdin:
            self.server.stdin.close()
        try:
            self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.server.terminate()
            self.server.wait(timeout=30)
        self.server = None


def redact(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return url


def probe(venv: Path, urls: list[str]) -> tuple[str, str] | None:
    """First URL that connects, with the server version; None if none does."""
    try:
        proc = subprocess.run(
            [str(venv_bin(venv, "python")), "-c", _PROBE, json.dumps(urls)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60 + 5 * len(urls),
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        say("the database probe timed out")
        return None
    last_error = "no answer"
    for line in proc.stdout.splitlines():
        try:
            result = json.loads(line)
        except ValueError:
            continue
        if "version" in result:
            return result["url"], result["version"]
        last_error = result.get("error", "")
    if proc.returncode and proc.stderr.strip():
        say("probe failed: " + proc.stderr.strip().splitlines()[-1])
    elif urls:
        first = last_error.splitlines()[0] if last_error else "unknown error"
        say(f"could not connect to {redact(urls[-1])}: {first}")
    return None


def socket_url(
    socket_dir: str, user: str, dbname: str = "postgres", port: int | None = None
) -> str:
    """A DATABASE_URL for a Unix socket directory, in the form django-environ understands.

    django-environ does not decode a url-encoded *host*; it takes a *path* that decodes to an
    absolute path as "socket directory / database name":
    ``postgres://postgres@/%2Fvar%2Frun%2Fpostgresql/postgres``.
    """
    sock = urllib.parse.quote(socket_dir.rstrip("/"), safe="")
    port_part = f":{port}" if port and port != 5432 else ""
    return f"postgres://{urllib.parse.quote(user, safe='')}@{port_part}/{sock}/{dbname}"


def local_candidates() -> list[str]:
    users = ["postgres"]
    try:
        me = getpass.getuser()
    except (KeyError, OSError):
        me = None
    if me and me not in users:
        users.append(me)
    urls = [f"postgres://{u}@127.0.0.1:5432/postgres" for u in users]
    for sock_dir in ("/var/run/postgresql", "/tmp"):  # noqa: S108 - libpq's socket dirs
        if Path(sock_dir, ".s.PGSQL.5432").exists():
            urls.extend(socket_url(sock_dir, u) for u in users)
    return urls


def start_embedded(venv: Path) -> Database:
    """Start pgserver (PostgreSQL 16, Unix socket only) with its data in .dbqueue-pgdata."""
    py = venv_bin(venv, "python")
    check = subprocess.run([str(py), "-c", "import pgserver"], capture_output=True, check=False)
    if check.returncode:
        info = interpreter_info(str(py))
        if info and info[1][:2] > (3, 12):
            raise SystemExit(
                f"dev.py: the embedded PostgreSQL (pgserver) supports Python 3.10-3.12 only, and "
                f"{venv.name} runs {fmt(info[1])}; set DATABASE_URL or start a local PostgreSQL"
            )
        say(f"installing {PGSERVER_SPEC} for the embedded PostgreSQL")
        if not pip_install(venv, [PGSERVER_SPEC]):
            raise SystemExit("dev.py: could not install pgserver; set DATABASE_URL instead")
    say(f"starting embedded PostgreSQL in {PGDATA.relative_to(REPO)}/")
    server = subprocess.Popen(
        [str(py), "-c", _EMBEDDED, str(PGDATA)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    uri = server.stdout.readline().strip() if server.stdout else ""
    if not uri:
        server.wait()
        raise SystemExit("dev.py: the embedded PostgreSQL did not start (see the output above)")
    db = Database(url=to_environ_url(uri), description="", server=server)
    found = probe(venv, [db.url])
    if not found:
        db.close()
        raise SystemExit(f"dev.py: started pgserver but cannot connect to {uri}")
    db.description = f"embedded PostgreSQL {found[1]} (pgserver)"
    return db


def to_environ_url(uri: str) -> str:
    """Rewrite pgserver's libpq URI (``postgresql://user:@/db?host=/dir``) for django-environ."""
    parts = urllib.parse.urlsplit(uri)
    query = urllib.parse.parse_qs(parts.query)
    socket_dir = query.get("host", [""])[0]
    dbname = parts.path.lstrip("/") or "postgres"
    user = parts.username or "postgres"
    if not socket_dir:  # already a host:port URL
        return uri
    return socket_url(socket_dir, urllib.parse.unquote(user), dbname, parts.port)


def find_database(venv: Path) -> Database:
    if os.environ.get("DBQUEUE_EMBEDDED") == "1":
        db = start_embedded(venv)
        db.description += ", forced by DBQUEUE_EMBEDDED=1"
    elif os.environ.get("DATABASE_URL"):
        url = os.environ["DATABASE_URL"]
        found = probe(venv, [url])
        if not found:
            raise SystemExit(f"dev.py: DATABASE_URL is set but {redact(url)} does not connect")
        db = Database(url=url, description=f"PostgreSQL {found[1]} from $DATABASE_URL")
    else:
        found = probe(venv, local_candidates())
        if found:
            db = Database(url=found[0], description=f"local PostgreSQL {found[1]}")
        else:
            say("no local PostgreSQL answered; falling back to the embedded one")
            db = start_embedded(venv)
    say(f"database: {redact(db.url)} ({db.description})")
    return db


# --------------------------------------------------------------------------------------
# Running steps
# --------------------------------------------------------------------------------------


@dataclass
class Step:
    name: str
    status: str = "SKIPPED"  # PASS | FAIL | SKIPPED
    seconds: float = 0.0
    note: str = ""


def tool_env(venv: Path, database_url: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = str(venv_bin(venv, "python").parent) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONHOME", None)
    if database_url:
        env["DATABASE_URL"] = database_url
    # tests/settings.py names pytest-django's test database after this: one per checkout and
    # Django series, so concurrent runs from two checkouts on one server don't collide.
    checkout = hashlib.sha256(str(REPO).encode()).hexdigest()[:8]
    env.setdefault("DBQUEUE_TEST_DATABASE", f"test_dbqueue_{venv.name}_{checkout}")
    return env


@contextlib.contextmanager
def checkout_lock(what: str) -> Iterator[None]:
    """Serialise dev.py runs in one checkout (shared venvs and test database names)."""
    try:
        import fcntl
    except ImportError:  # not on Unix: no locking
        yield
        return
    VENVS.mkdir(exist_ok=True)
    with open(VENVS / ".dev-py.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another dev.py run in this checkout holds the lock; waiting to {what}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_step(step: Step, cmd: list[str], env: dict[str, str]) -> int:
    print(f"\n==> {step.name}\n  $ {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    try:
        rc = subprocess.run(cmd, cwd=REPO, env=env, check=False).returncode
    except OSError as exc:
        print(f"  {exc}", flush=True)
        rc = 127
    step.seconds = time.monotonic() - started
    step.status = "PASS" if rc == 0 else "FAIL"
    if rc and not step.note:
        step.note = f"exit {rc}" + (" (no tests ran)" if rc == 5 and "pytest" in step.name else "")
    return rc


def junit_counts(path: Path) -> tuple[int, int, int] | None:
    """(passed, failed, skipped) from a pytest --junitxml report."""
    try:
        root = ET.parse(path).getroot()  # noqa: S314 - our own pytest report
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = failed = skipped = 0
    for s in suites:
        total += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    return total - failed - skipped, failed, skipped


def print_summary(steps: list[Step], counts: list[int]) -> None:
    width = max(len(s.name) for s in steps)
    print("\n" + "=" * (width + 30), flush=True)
    print(f"{'step'.ljust(width)}  result   time", flush=True)
    for s in steps:
        t = f"{s.seconds:6.1f}s" if s.status != "SKIPPED" else "      -"
        print(f"{s.name.ljust(width)}  {s.status:<7}  {t}  {s.note}".rstrip(), flush=True)
    print("=" * (width + 30), flush=True)
    passed, failed, skipped = counts
    # One plain closing line that CI can read whatever ran before it.
    print(f"tests: {passed} passed, {failed} failed, {skipped} skipped", flush=True)


def selected_series(django: str | None) -> list[Series]:
    return [s for s in SERIES if django in (None, s.key)]


def cmd_test(args: argparse.Namespace, pytest_args: list[str]) -> int:
    steps: list[Step] = []
    venvs: dict[str, Path | None] = {}
    for series in selected_series(args.django):
        venvs[series.key] = venv = ensure_venv(series, recreate=args.recreate)
        if venv is None:
            major = series.key.split(".")[0]
            print(
                f"SKIPPED: Django {major}.x run needs Python >= {fmt(series.min_python)}, "
                "none found",
                flush=True,
            )
    if not any(venvs.values()):
        steps = [Step(f"pytest (Django {k})", note="no suitable Python found") for k in venvs]
        print_summary(steps, [0, 0, 0])
        return 1

    # Lint, migrations, docs and the database probe use the oldest series' venv.
    primary_key, primary = next((k, v) for k, v in venvs.items() if v is not None)
    db = find_database(primary)
    counts = [0, 0, 0]
    try:
        if not args.fast:
            env = tool_env(primary, db.url)
            env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
            label = f"Django {primary_key}"
            checks: list[tuple[str, list[str]]] = [
                ("ruff check", [str(venv_bin(primary, "ruff")), "check", "."]),
                ("ruff format --check", [str(venv_bin(primary, "ruff")), "format", "--check", "."]),
                (
                    "makemigrations --check",
                    [
                        str(venv_bin(primary, "python")),
                        "-m",
                        "django",
                        "makemigrations",
                        "--check",
                        "--dry-run",
                    ],
                ),
            ]
            for name, cmd in checks:
                step = Step(f"{name} ({label})")
                steps.append(step)
                run_step(step, cmd, env)
            docs = Step(f"mkdocs build --strict ({label})", note="no mkdocs.yml")
            steps.append(docs)
            if (REPO / "mkdocs.yml").exists():
                docs.note = ""
                run_step(docs, [str(venv_bin(primary, "mkdocs")), "build", "--strict"], env)

        with tempfile.TemporaryDirectory(prefix="dbqueue-junit-") as tmp:
            wheel = None
            if not args.fast:
                wheel = build_and_check_package(steps, primary, Path(tmp) / "dist")
            for key, venv in venvs.items():
                step = Step(f"pytest (Django {key})")
                steps.append(step)
                if venv is None:
                    step.note = "no suitable Python found"
                    continue
                report = Path(tmp) / f"pytest-{venv.name}.xml"
                run_pytest(step, venv, report, pytest_args, tool_env(venv, db.url), counts)
            if not args.fast:
                for series in selected_series(args.django):
                    step = Step(f"quickstart from the wheel (Django {series.key})")
                    steps.append(step)
                    venv = venvs.get(series.key)
                    if venv is None or wheel is None:
                        step.note = "no suitable Python found" if venv is None else "no wheel"
                        continue
                    report = Path(tmp) / f"quickstart-wheel-{venv.name}.xml"
                    quickstart_from_wheel(step, series, venv, wheel, report, db.url, counts)
    finally:
        db.close()

    print_summary(steps, counts)
    return 1 if any(s.status == "FAIL" for s in steps) else 0


def run_pytest(
    step: Step, venv: Path, report: Path, args: list[str], env: dict[str, str], counts: list[int]
) -> None:
    """Run pytest in ``venv``; add its passed/failed/skipped to ``counts`` and to the step."""
    cmd = [str(venv_bin(venv, "python")), "-m", "pytest", f"--junitxml={report}", *args]
    rc = run_step(step, cmd, env)
    found = junit_counts(report)
    if found:
        for i, n in enumerate(found):
            counts[i] += n
        counted = f"{found[0]} passed, {found[1]} failed, {found[2]} skipped"
        step.note = f"{step.note}; {counted}" if step.note else counted
    elif rc:
        counts[1] += 1  # pytest died before writing a report: count it as a failure


# --------------------------------------------------------------------------------------
# The release: sdist and wheel, checked, and the quickstart run against the installed wheel
# --------------------------------------------------------------------------------------

PACKAGE = "django_dbqueue"
QUICKSTART_TEST = "tests/acceptance/test_quickstart.py"


def package_files() -> set[str]:
    """The package's files, as paths from the repository root: those git tracks (so that a stray
    file in a developer's checkout is not expected in the wheel), else every file on disk."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", PACKAGE], cwd=REPO, capture_output=True, check=False
    )
    if tracked.returncode == 0 and tracked.stdout:
        names = {name.decode() for name in tracked.stdout.split(b"\0") if name}
        return {name for name in names if (REPO / name).is_file()}  # not a deleted one
    return {
        path.relative_to(REPO).as_posix()
        for path in (REPO / PACKAGE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def wheel_problems(wheel: Path) -> list[str]:
    """What is wrong with the wheel's file list: a file of the package missing from it (a
    migration, a template, a static file, py.typed: whatever the source tree holds), or a file
    that is not the package's (tests/, the example project, dev tooling)."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    source = package_files()
    problems = [f"missing from the wheel: {name}" for name in sorted(source - names)]
    dist_info = wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info/"
    problems += [
        f"not part of the package: {name}"
        for name in sorted(names)
        if not name.startswith((f"{PACKAGE}/", dist_info))
    ]
    for what, prefix in (
        ("the migrations", f"{PACKAGE}/migrations/0001_initial.py"),
        ("the admin templates", f"{PACKAGE}/templates/"),
        ("the py.typed marker", f"{PACKAGE}/py.typed"),
    ):
        if not any(name.startswith(prefix) for name in names):
            problems.append(f"the wheel has none of {what} ({prefix})")
    return problems


def build_and_check_package(steps: list[Step], venv: Path, outdir: Path) -> Path | None:
    """``python -m build`` (the sdist, then the wheel built from the sdist), ``twine check``
    and the wheel's file list. Returns the wheel, or None when it could not be built."""
    env = tool_env(venv, None)
    py = str(venv_bin(venv, "python"))
    build = Step("python -m build")
    steps.append(build)
    cmd = [py, "-m", "build", "--outdir", str(outdir)]
    uv = None if os.environ.get("DBQUEUE_NO_UV") else find_uv()
    if uv is not None:  # build's isolated environment, installed by uv: seconds instead of ~20
        cmd += ["--installer", "uv"]
        env["PATH"] = str(uv.parent) + os.pathsep + env["PATH"]
    run_step(build, [*cmd, "."], env)
    dists = sorted(outdir.glob("*.tar.gz")) + sorted(outdir.glob("*.whl"))
    twine = Step("twine check --strict")
    steps.append(twine)
    if not dists:
        build.status, twine.note = "FAIL", "nothing built"
        return None
    run_step(twine, [py, "-m", "twine", "check", "--strict", *map(str, dists)], env)
    contents = Step("the wheel's files")
    steps.append(contents)
    wheels = [d for d in dists if d.suffix == ".whl"]
    if len(wheels) != 1:
        contents.status, contents.note = "FAIL", f"{len(wheels)} wheels built"
        return None
    print(f"\n==> {contents.name}: {wheels[0].name}", flush=True)
    problems = wheel_problems(wheels[0])
    for problem in problems:
        print(f"  {problem}", flush=True)
    contents.status = "FAIL" if problems else "PASS"
    contents.note = f"{len(problems)} problem(s)" if problems else wheels[0].name
    return wheels[0]


def quickstart_from_wheel(
    step: Step,
    series: Series,
    test_venv: Path,
    wheel: Path,
    report: Path,
    database_url: str,
    counts: list[int],
) -> None:
    """Install the built wheel (and only it, with its dependencies from PyPI) into a fresh venv,
    then run the quickstart test with that venv's Python running the quickstart's project."""
    found = find_python(series)
    if found is None:
        step.note = "no suitable Python found"
        return
    venv = VENVS / f"wheel-{series.venv_name}"
    print(f"\n==> {step.name}: a fresh {venv.relative_to(REPO)} with {wheel.name}", flush=True)
    started = time.monotonic()
    made = subprocess.run([found[0], "-m", "venv", "--clear", str(venv)], check=False)
    reqs = [str(wheel), series.requirement]
    if needs_psycopg_binary():
        reqs.append("psycopg[binary]")
    if made.returncode or not pip_install(venv, reqs):
        step.status, step.seconds = "FAIL", time.monotonic() - started
        step.note = "could not install the wheel into a fresh venv"
        counts[1] += 1
        return
    env = tool_env(test_venv, database_url)
    env["DBQUEUE_QUICKSTART_PYTHON"] = str(venv_bin(venv, "python"))
    run_pytest(step, test_venv, report, [QUICKSTART_TEST, "-p", "no:cacheprovider"], env, counts)
    step.seconds = time.monotonic() - started


def prepared_venv(series: Series, recreate: bool) -> Path:
    with checkout_lock("set up the venv"):
        venv = ensure_venv(series, recreate=recreate)
    if venv is None:
        raise SystemExit(f"dev.py: no Python >= {fmt(series.min_python)} found for the venv")
    return venv


def run_script(venv: Path, script: list[list[str]], database_url: str) -> int:
    """Run each command with the venv's Python; stop at the first that fails."""
    env = tool_env(venv, database_url)
    for cmd in script:
        full = [str(venv_bin(venv, "python")), *cmd]
        print(f"\n==> {' '.join(cmd)}", flush=True)
        rc = subprocess.run(full, cwd=REPO, env=env, check=False).returncode
        if rc:
            say(f"{' '.join(cmd)} exited with {rc}")
            return rc
    return 0


def with_database(url: str, name: str) -> str:
    """The same server URL, naming database ``name`` (the last segment of the path)."""
    parts = urllib.parse.urlsplit(url)
    head = parts.path.rpartition("/")[0] if parts.path.count("/") > 1 else ""
    return urllib.parse.urlunsplit(parts._replace(path=f"{head}/{name}"))


def demo_database(venv: Path, server_url: str, action: str, name: str = DEMO_DATABASE) -> str:
    """Create (or reuse) or drop the demo's database: "created", "reused", "dropped", "absent".

    Exits with dev.py's message when the server refuses, or when a database of that name exists
    that dev.py did not create.
    """
    py = str(venv_bin(venv, "python"))
    proc = subprocess.run(
        [py, "-c", _DEMO_DB, server_url, name, action, DEMO_MARKER],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=REPO,
    )
    if proc.returncode:
        lines = proc.stderr.strip().splitlines()
        raise SystemExit(f"dev.py: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return proc.stdout.strip()


DEMO_MANAGE = "example_project/manage.py"
DEMO_ADMIN = "admin"
# Runs in ``manage.py shell -c``: makes DEMO_ADMIN a superuser with the password in the
# environment (never on a command line, where ps would show it), creating it if need be.
_DEMO_ADMIN_SCRIPT = """
import os
from django.contrib.auth import get_user_model
user, _ = get_user_model().objects.get_or_create(username=os.environ["DBQUEUE_DEMO_ADMIN"])
user.is_staff = user.is_superuser = user.is_active = True
user.set_password(os.environ["DBQUEUE_DEMO_PASSWORD"])
user.save()
"""


def demo_admin(venv: Path, demo_url: str) -> str | None:
    """Give the demo database a superuser ``admin`` with a new random password; return it.

    A new password on every run: it is printed once, and one left over from an earlier run
    stops working. None (and dev.py says why) when the user could not be written.
    """
    import secrets

    password = secrets.token_urlsafe(12)
    env = tool_env(venv, demo_url)
    env.pop("DJANGO_SETTINGS_MODULE", None)  # manage.py names the example project's settings
    env.update(DBQUEUE_DEMO_ADMIN=DEMO_ADMIN, DBQUEUE_DEMO_PASSWORD=password)
    cmd = [str(venv_bin(venv, "python")), DEMO_MANAGE, "shell", "-c", _DEMO_ADMIN_SCRIPT]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        say(f"could not create the admin user: {lines[-1] if lines else proc.returncode}")
        return None
    return password


def browse_command(venv: Path, demo_url: str) -> str:
    """The shell command that serves the demo project on its database: the demo venv's own
    Python (Django is only there), absolute paths, so that it works as printed from anywhere."""
    import shlex

    python = shlex.quote(str(venv_bin(venv, "python")))
    manage = shlex.quote(str(REPO / DEMO_MANAGE))
    return f"DATABASE_URL={shlex.quote(redact(demo_url))} {python} {manage} runserver"


def cmd_demo(args: argparse.Namespace, extra: list[str]) -> int:
    manage = DEMO_MANAGE
    if not (REPO / manage).exists():
        say(f"{manage} does not exist yet")
        return 1
    venv = prepared_venv(DEMO_SERIES, args.recreate)
    db = find_database(venv)
    try:
        done = demo_database(venv, db.url, "create")
        demo_url = with_database(db.url, DEMO_DATABASE)
        how = "created it" if done == "created" else "reusing it from an earlier demo"
        say(f"demo database: {redact(demo_url)} ({how}; the server's own databases stay untouched)")
        rc = run_script(
            venv, [[manage, "migrate", "--noinput"], [manage, "shop_demo", *extra]], demo_url
        )
        keep = not args.drop or args.serve
        password = demo_admin(venv, demo_url) if keep and rc == 0 else None
        if password:
            say(
                f"admin: http://127.0.0.1:8000/admin/ as {DEMO_ADMIN!r} with the password "
                f"{password} (a new one on every demo run)"
            )
        if args.serve and rc == 0:
            say("serving the demo project on http://127.0.0.1:8000/ until Ctrl-C")
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the server, not dev.py
                run_script(venv, [[manage, "runserver", "--noreload"]], demo_url)
        if args.drop:
            demo_database(venv, db.url, "drop")
            say(f"dropped the demo database {DEMO_DATABASE}")
        elif db.server is not None:
            say(
                f"kept the demo database {DEMO_DATABASE} in the embedded server's "
                f"{PGDATA.relative_to(REPO)}/, which stops with dev.py: browse it with "
                "`python3 dev.py demo --serve`; `python3 dev.py demo --drop` drops it"
            )
        else:
            hidden = "***" in redact(demo_url)  # never print the server's password
            say(
                f"kept the demo database {DEMO_DATABASE}: browse it with\n\n"
                f"    {browse_command(venv, demo_url)}\n\n"
                + ("(your server's password where *** is), " if hidden else "")
                + "or with `python3 dev.py demo --serve`; `python3 dev.py demo --drop` drops it"
            )
        return rc
    finally:
        db.close()


def cmd_bench(args: argparse.Namespace, extra: list[str]) -> int:
    bench = "benchmarks/bench.py"
    if not (REPO / bench).exists():
        say(f"{bench} does not exist yet")
        return 1
    venv = prepared_venv(SERIES[0], args.recreate)
    db = find_database(venv)
    try:
        return run_script(venv, [[bench, *extra]], db.url)
    finally:
        db.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dev.py",
        description="Test, demo and benchmark django-dbqueue (stdlib-only bootstrapper).",
        epilog="Arguments dev.py does not know are passed on (to pytest, shop_demo or "
        "bench.py); put them after -- to be explicit.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    test = sub.add_parser(
        "test",
        allow_abbrev=False,
        help="lint, migration check, docs and pytest on every supported Django",
        description="Lint, check migrations, build the docs, then pytest on Django 5.2 and 6.1. "
        "Unknown arguments go to pytest.",
    )
    test.add_argument(
        "--fast", action="store_true", help="skip ruff, migrations, docs and packaging"
    )
    test.add_argument(
        "--django", choices=[s.key for s in SERIES], help="test one Django series only"
    )
    demo = sub.add_parser(
        "demo",
        allow_abbrev=False,
        help="run the example shop end to end in a database of its own",
        description=f"Create the database {DEMO_DATABASE} (or reuse dev.py's earlier one), "
        "migrate the example project into it and run shop_demo. Unknown arguments go to "
        "shop_demo.",
    )
    demo.add_argument(
        "--drop",
        action="store_true",
        help=f"drop the database {DEMO_DATABASE} when the demo is done (kept by default)",
    )
    demo.add_argument(
        "--serve",
        action="store_true",
        help="after the demo, serve the example project (runserver, in the demo's venv) on "
        "127.0.0.1:8000 until Ctrl-C; with the embedded server, the only way to browse it",
    )
    bench = sub.add_parser("bench", allow_abbrev=False, help="run benchmarks/bench.py")
    for p in (test, demo, bench):
        p.add_argument(
            "--recreate", action="store_true", help="rebuild the virtualenv(s) from scratch"
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    extra += passthrough
    os.chdir(REPO)
    handler = {"test": cmd_test, "demo": cmd_demo, "bench": cmd_bench}[args.command]
    try:
        if args.command == "test":
            with checkout_lock("run the tests"):
                return handler(args, extra)
        return handler(args, extra)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
