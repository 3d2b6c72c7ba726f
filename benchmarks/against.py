#!/usr/bin/env python
"""Run a benchmark script against an earlier commit and against this tree, in turn.

A before/after of a change's last commit hides a regression that an earlier commit of the same
change brought in; this runs any commit or release (``--ref``) beside today's tree, on every row
of whatever benchmark script it is given, in one invocation:

    python benchmarks/against.py --ref e5cbb1f --rounds 2 -- benchmarks/drain_command.py --repeat 3
    python benchmarks/against.py --ref v0.1.0 -- benchmarks/bench.py --only drain,enqueue

How: ``git worktree add`` of the ref in a temporary directory, into which today's
``benchmarks/`` is copied, so that both sides run the same benchmark code and only the package
differs. Each side runs with its own tree first on ``PYTHONPATH`` (the worker processes that a
script starts import that tree's package too; every script prints which package it imported)
and its own database (``--database`` is appended: ``<name>`` for this tree, ``<name>_ref`` for
the ref), since the two trees' migrations may differ. The sides alternate, ref first in odd
rounds and this tree first in even ones, so both meet the same machine; each run's output is
printed whole under a header. The interpreter is this one (one venv for both). The worktree is
removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_side(label, tree, script, script_args, database, log=None):
    """Run ``script`` of ``tree`` with that tree's package and ``database``; its output goes to
    this process's (under a header) or, with ``log``, to that file. Returns the exit status."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(tree / script), *script_args, "--database", database]
    header = f"\n===== {label}: {tree} ({' '.join(cmd[1:])})"
    if log is None:
        print(header, flush=True)
        return subprocess.run(cmd, cwd=tree, env=env, check=False).returncode
    with open(log, "w") as out:
        print(header, file=out, flush=True)
        return subprocess.run(
            cmd, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode


def resolve(ref):
    """The commit ``ref`` names in this repository, or None."""
    resolved = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    return None if resolved.returncode else resolved.stdout.strip()


@contextlib.contextmanager
def ref_tree(commit):
    """A temporary worktree of ``commit`` with today's ``benchmarks/``; removed on the way out."""
    tmp = Path(tempfile.mkdtemp(prefix="dbqueue-against-"))
    tree = tmp / "ref"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO, check=True)
    try:
        shutil.rmtree(tree / "benchmarks")
        shutil.copytree(
            REPO / "benchmarks",
            tree / "benchmarks",
            ignore=shutil.ignore_patterns("__pycache__", "results"),
        )
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="the earlier commit, tag or branch")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side (default 1)")
    parser.add_argument("--database", default="dbqueue_bench", help="base name of the databases")
    parser.add_argument("script", help="a benchmark script, relative to the repository")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    script = Path(args.script)
    if not (REPO / script).is_file():
        parser.error(f"no benchmark script {script} in {REPO}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    commit = resolve(args.ref)
    if commit is None:
        parser.error(f"--ref {args.ref!r} is not a commit of this repository")
    script_args = [a for a in args.script_args if a != "--"]

    failed = 0
    with ref_tree(commit) as tree:
        sides = [
            ("ref " + commit[:10], tree, args.database + "_ref"),
            ("this tree", REPO, args.database),
        ]
        for round_ in range(args.rounds):
            for label, root, database in sides if round_ % 2 == 0 else sides[::-1]:
                rc = run_side(f"round {round_ + 1}, {label}", root, script, script_args, database)
                failed |= rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
