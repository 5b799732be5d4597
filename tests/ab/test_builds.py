"""Builds of git refs, with real git and pip: this checkout's HEAD built and imported from its own
environment (torch shared, never reinstalled; package data shipped; the editable install here
not leaking in), then reused; a tiny package built at an older commit; a failed build kept aside
for its log. A build installs from source without the network: about 2 s here.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from llmbench.ab.builds import MARKER, Build, build, builds_cache, resolve_commit
from llmbench.errors import UserError

REPO = Path(__file__).resolve().parents[2]
# What the build's interpreter reports about the llmbench and torch it imports.
PROBE = """
import json, sys, llmbench, torch
print(json.dumps({"llmbench": llmbench.__file__, "version": llmbench.__version__,
                  "torch": torch.__file__, "prefix": sys.prefix, "python": sys.version}))
"""


def _git(repo: Path, *args: str) -> str:
    command = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    return subprocess.run([*command, *args], capture_output=True, text=True, check=True).stdout


def _run_python(python: Path, code: str, cwd: Path) -> str:
    """`code` run by `python` from `cwd`, away from any checkout (the working folder comes first
    on sys.path), without PYTHONPATH."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [str(python), "-c", code], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _tiny_package(repo: Path, value: int) -> None:
    """A one-module Python project, committed with VALUE = `value`."""
    (repo / "tinypkg").mkdir(parents=True, exist_ok=True)
    (repo / "tinypkg" / "__init__.py").write_text(f"VALUE = {value}\n")
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "tinypkg"\nversion = "0.0.1"\n'
    )
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", f"value {value}")


def test_resolve_commit_names_the_full_commit_of_head():
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert resolve_commit(REPO, "HEAD") == head
    assert resolve_commit(REPO, head[:10]) == head


def test_resolve_commit_rejects_a_ref_that_names_nothing_in_one_line():
    with pytest.raises(UserError) as caught:
        resolve_commit(REPO, "no-such-ref-anywhere")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"git:no-such-ref-anywhere: no such commit in {REPO}")
    assert message.endswith("(git log --oneline)")


def test_resolve_commit_takes_a_ref_that_looks_like_an_option_as_a_name():
    with pytest.raises(UserError, match="^git:--all: no such commit"):
        resolve_commit(REPO, "--all")


def test_resolve_commit_outside_a_git_repository(tmp_path):
    with pytest.raises(UserError) as caught:
        resolve_commit(tmp_path, "HEAD")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"git:HEAD: {tmp_path} is not a git repository (git: fatal: ")


def test_the_label_is_the_ref_and_the_short_commit():
    commit = "3f2a1bc" + "0" * 33
    folder = Path("/cache") / commit
    built = Build("HEAD~1", commit, folder / "venv" / "bin" / "python", folder)
    assert built.label == "git:HEAD~1 (3f2a1bc)"


def test_builds_cache_is_under_the_llmbench_cache():
    assert builds_cache({"LLMBENCH_CACHE": "/x/cache"}) == Path("/x/cache/ab-builds")
    assert builds_cache({}) == Path.home() / ".cache" / "llmbench" / "ab-builds"


@pytest.fixture(scope="module")
def head_build(tmp_path_factory):
    """This checkout's HEAD built into a fresh cache, with the progress lines it logged."""
    cache = tmp_path_factory.mktemp("cache")
    lines: list[str] = []
    return build(REPO, "HEAD", cache, log=lines.append), cache, lines


def test_a_build_of_head_lands_in_the_cache_under_its_commit(head_build):
    built, cache, lines = head_build
    commit = resolve_commit(REPO, "HEAD")
    assert built == Build(
        "HEAD", commit, cache / commit / "venv" / "bin" / "python", cache / commit
    )
    assert lines == [f"building git:HEAD ({commit[:7]}) into {cache / commit}"]
    assert sorted(path.name for path in cache.iterdir()) == [commit]  # no tmp folder left
    # The marker names the environment whose packages the build sees: this one.
    assert (cache / commit / MARKER).read_text().splitlines() == site.getsitepackages()


def test_the_build_imports_its_own_llmbench_and_this_environments_torch(head_build, tmp_path):
    import torch

    import llmbench

    built, _, _ = head_build
    seen = json.loads(_run_python(built.python, PROBE, tmp_path))
    assert Path(seen["prefix"]) == built.folder / "venv"
    assert seen["python"] == sys.version  # made by this interpreter: torch's binaries fit
    # The editable install of this checkout does not leak in: llmbench is the build's copy.
    assert Path(seen["llmbench"]).is_relative_to(built.folder / "venv"), seen["llmbench"]
    assert seen["version"] == llmbench.__version__
    assert seen["torch"] == torch.__file__  # shared, not reinstalled


def test_the_build_ships_the_package_data(head_build, tmp_path):
    built, _, _ = head_build
    code = "import llmbench; print(llmbench.__file__)"
    package = Path(_run_python(built.python, code, tmp_path).strip()).parent
    listed = _git(REPO, "ls-tree", "--name-only", "HEAD", "llmbench/kernels/csrc/").split()
    assert sorted(path.name for path in (package / "kernels" / "csrc").iterdir()) == sorted(
        Path(name).name for name in listed
    )
    assert (package / "compare" / "default_gates.yaml").is_file()


def test_the_console_script_names_the_build_in_its_final_place(head_build):
    built, _, _ = head_build
    script = built.folder / "venv" / "bin" / "llmbench"
    assert script.read_text().splitlines()[0] == f"#!{built.python}"


def test_the_build_says_which_run_options_its_commit_has(head_build, tmp_path):
    """`ab` passes `--no-report` to a build's rounds only where that commit's `run` has it."""
    built, _, _ = head_build
    assert built.takes_run_option("--no-report")  # HEAD: this checkout's commit
    assert not built.takes_run_option("--no-such-option")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _tiny_package(repo, 1)  # no llmbench/cli/run.py at all
    assert not build(repo, "HEAD", tmp_path / "cache").takes_run_option("--no-report")


def test_a_second_build_of_the_same_commit_reuses_the_first(head_build):
    built, cache, _ = head_build
    marker = built.folder / MARKER
    mtime_ns = marker.stat().st_mtime_ns
    lines: list[str] = []
    again = build(REPO, built.commit, cache, log=lines.append)
    assert again == Build(built.commit, built.commit, built.python, built.folder)
    assert lines == [
        f"reusing the build of git:{built.commit} ({built.commit[:7]}) in {built.folder}"
    ]
    assert marker.stat().st_mtime_ns == mtime_ns


def test_a_build_is_of_the_commit_not_the_working_tree(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _tiny_package(repo, 1)
    _tiny_package(repo, 2)
    (repo / "tinypkg" / "__init__.py").write_text("VALUE = 3\n")  # not committed
    built = build(repo, "HEAD~1", tmp_path / "cache")
    code = "import tinypkg; print(tinypkg.VALUE, tinypkg.__file__)"
    value, where = _run_python(built.python, code, tmp_path).split()
    assert value == "1"
    assert Path(where).is_relative_to(built.folder / "venv")


def test_a_build_for_another_environment_and_dead_leftovers_are_replaced(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _tiny_package(repo, 1)
    cache = tmp_path / "cache"
    built = build(repo, "HEAD", cache)
    marker = built.folder / MARKER
    ours = marker.read_text()
    marker.write_text("/another/venv/lib/python3.11/site-packages\n")
    dead = cache / f"{built.commit}.tmp-4194305"  # above any pid Linux hands out
    alive = cache / f"{built.commit}.tmp-1"  # init's: perhaps still building
    dead.mkdir()
    alive.mkdir()

    lines: list[str] = []
    again = build(repo, "HEAD", cache, log=lines.append)
    assert again == built
    assert lines == [f"building git:HEAD ({built.commit[:7]}) into {built.folder}"]
    assert marker.read_text() == ours
    assert sorted(path.name for path in cache.iterdir()) == [built.commit, alive.name]


def test_a_failed_build_names_its_log_and_leaves_no_build(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "README").write_text("not a Python project\n")
    _git(repo, "add", "README")
    _git(repo, "commit", "-q", "-m", "one")
    commit = resolve_commit(repo, "HEAD")
    cache = tmp_path / "cache"
    failed = cache / f"{commit}.tmp-{os.getpid()}"
    for _ in range(2):  # the second attempt clears the first one's folder before it starts
        with pytest.raises(UserError) as caught:
            build(repo, "HEAD", cache)
        message = str(caught.value)
        assert "\n" not in message
        assert message == (
            f"git:HEAD ({commit[:7]}): building commit {commit} failed (pip install: exit 1); "
            f"see {failed / 'build.log'}"
        )
        # The failed build stays aside, in its tmp folder, for its log: never at cache/<commit>.
        assert sorted(path.name for path in cache.iterdir()) == [failed.name]
        assert "Neither 'setup.py' nor 'pyproject.toml' found" in (failed / "build.log").read_text()
