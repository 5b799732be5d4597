"""A git ref of llmbench built into its own virtual environment: one side of `llmbench ab`.

A build is keyed by the commit the ref names, so it never goes stale: cache/<commit>/ holds the
source (`git archive` of that commit, no worktree), a virtual environment with that source
installed in it (a real install, package data included: `kernels/csrc/*`, the YAML files) and
pip's log. The environment reuses the running interpreter's packages — torch above all, never
reinstalled, so both sides of an A/B run the same torch — through a .pth file listing this
environment's site-packages after its own. Python does not process the .pth files inside a folder
that a .pth lists, so an editable install of llmbench here (its `__editable__` finder .pth) does
not reach into the build: the build imports its own llmbench.

A build is made in a sibling folder cache/<commit>.tmp-<pid> and renamed into place once
complete, so a build interrupted half-way is never reused. Its `built` marker, written last,
lists the site-packages it sees: a build made from another environment (another venv sharing the
cache) is rebuilt rather than run against that environment's packages. A failed build is left in
its tmp folder for its log, until a build of that commit starts after its process has ended.

Run the build as `<python> -m llmbench` from a folder that is not a checkout of llmbench:
`python -m` and `-c` put the working folder first on sys.path, ahead of the build's own package.
"""

from __future__ import annotations

import os
import shlex
import shutil
import site
import subprocess
import sys
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from llmbench.errors import UserError

# In the build's site-packages: the running environment's site-packages, searched after its own.
PARENT_PTH = "_llmbench_ab_parent.pth"
# Written last in a complete build: the same lines as PARENT_PTH, the environment it was made for.
MARKER = "built"
BUILD_LOG = "build.log"


@dataclass(frozen=True)
class Build:
    """llmbench at one commit, installed into the virtual environment under `folder`."""

    ref: str  # what the user gave: "HEAD~1", "main", "3f2a1bc"
    commit: str  # the full 40-hex commit `ref` resolved to
    python: Path  # the build's interpreter: <folder>/venv/bin/python
    folder: Path  # <cache>/<commit>/

    @property
    def label(self) -> str:
        """The ref and its short commit, as a person reads them: "git:HEAD~1 (3f2a1bc)"."""
        return f"git:{self.ref} ({self.commit[:7]})"

    def takes_run_option(self, option: str) -> bool:
        """Whether this commit's `llmbench run` has `option` (an older one may lack it), read
        from its source."""
        run_cli = self.folder / "src" / "llmbench" / "cli" / "run.py"
        return run_cli.is_file() and f'"{option}"' in run_cli.read_text()


def builds_cache(env: Mapping[str, str] | None = None) -> Path:
    """$LLMBENCH_CACHE/ab-builds (default ~/.cache/llmbench/ab-builds)."""
    env = os.environ if env is None else env
    base = Path(env.get("LLMBENCH_CACHE") or Path.home() / ".cache" / "llmbench")
    return base / "ab-builds"


def resolve_commit(repo: Path, ref: str) -> str:
    """The full commit `ref` names in the git repository at `repo`; UserError (one line: the ref,
    the repo, what to do) when it names none, or when `repo` is not a git repository or git is
    missing."""
    # --end-of-options: a ref that starts with "-" is a name, never an option.
    command = ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", "--end-of-options"]
    try:
        result = subprocess.run([*command, f"{ref}^{{commit}}"], capture_output=True, text=True)
    except OSError as error:
        raise UserError(f"git:{ref}: cannot run git ({error}); install git") from None
    if result.returncode == 0:
        return result.stdout.strip()
    detail = _first_line(result.stderr)
    if result.returncode == 128:  # git's fatal errors: no repository, no such folder
        raise UserError(
            f"git:{ref}: {repo} is not a git repository (git: {detail}); "
            "give the folder of a git checkout of llmbench"
        )
    why = f" (git rev-parse: {detail})" if detail else ""  # --quiet: usually nothing
    raise UserError(
        f"git:{ref}: no such commit in {repo}{why}; "
        "give a branch, tag or commit that exists (git log --oneline)"
    )


def build(repo: Path, ref: str, cache: Path, *, log: Callable[[str], None] | None = None) -> Build:
    """llmbench at `ref` installed into its own virtual environment under cache/<commit>/, reusing
    the packages of the running interpreter's environment (torch above all: never reinstalled)."""
    say = log or (lambda line: None)
    commit = resolve_commit(repo, ref)
    folder = Path(cache) / commit
    done = Build(ref, commit, folder / "venv" / "bin" / "python", folder)
    parent = _parent_pth_text()
    if _is_complete(folder, parent):
        say(f"reusing the build of {done.label} in {_shown(folder)}")
        return done
    say(f"building {done.label} into {_shown(folder)}")
    _remove_leftovers(Path(cache), commit)
    tmp = Path(cache) / f"{commit}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    _extract(repo, commit, tmp / "src", done.label)

    build_log = tmp / BUILD_LOG
    venv = tmp / "venv"
    python = venv / "bin" / "python"
    venv_command = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
    _run_logged(venv_command, "python -m venv", build_log, done)
    # Before the install: pip builds with this environment's setuptools (no build isolation).
    (_site_packages(python) / PARENT_PTH).write_text(parent)
    # pip --python runs this environment's pip with the build's interpreter. --ignore-installed:
    # the llmbench this environment has (visible through the .pth) is neither "already
    # satisfied" nor a thing to uninstall.
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps"]
    pip += ["--no-build-isolation", "--no-index", "--ignore-installed", "--quiet"]
    _run_logged([*pip, str(tmp / "src")], "pip install", build_log, done)

    # A venv is not relocatable: its scripts name their interpreter by absolute path.
    _repoint_scripts(venv / "bin", str(venv), str(folder / "venv"))
    (tmp / MARKER).write_text(parent)
    if folder.exists():
        if _is_complete(folder, parent):  # another process built the same commit first
            shutil.rmtree(tmp)
            return done
        shutil.rmtree(folder)  # made for another environment: replaced
    os.rename(tmp, folder)
    return done


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else ""


def _shown(path: Path) -> str:
    """`path` with the home folder written as ~."""
    home = Path.home()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


def _parent_pth_text() -> str:
    """The .pth lines naming the running environment's site-packages (and the user's, where this
    interpreter reads it): what the build sees after its own packages."""
    folders = list(site.getsitepackages())
    user = site.getusersitepackages()
    if site.ENABLE_USER_SITE and os.path.isdir(user):
        folders.append(user)
    return "".join(f"{folder}\n" for folder in dict.fromkeys(folders))


def _is_complete(folder: Path, parent: str) -> bool:
    """A finished build made for this environment: its interpreter and its marker, which lists
    the same site-packages."""
    marker = folder / MARKER
    python = folder / "venv" / "bin" / "python"
    return python.exists() and marker.is_file() and marker.read_text() == parent


def _remove_leftovers(cache: Path, commit: str) -> None:
    """Remove the unfinished builds of `commit` by this process or by processes that are gone
    (a failed build keeps its folder until then, for its log)."""
    for leftover in cache.glob(f"{commit}.tmp-*"):
        pid = leftover.name.rpartition("-")[2]
        if pid.isdigit() and (int(pid) == os.getpid() or not _is_running(int(pid))):
            shutil.rmtree(leftover)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _extract(repo: Path, commit: str, dest: Path, label: str) -> None:
    """The files of `commit` into `dest`, streamed from `git archive` (no worktree, no checkout)."""
    dest.mkdir()
    command = ["git", "-C", str(repo), "archive", "--format=tar", commit]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as git:
        with tarfile.open(fileobj=git.stdout, mode="r|") as tar:
            tar.extractall(dest, filter="data")
        error = git.stderr.read().decode(errors="replace")
    if git.returncode != 0:
        raise UserError(
            f"{label}: git archive of {commit} in {repo} failed ({_first_line(error)}); "
            "check that the repository is readable (git fsck)"
        )


def _run_logged(command: list[str], step: str, build_log: Path, done: Build) -> None:
    """Run one build step, its command line and output appended to the build log."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    with build_log.open("a") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        raise UserError(
            f"{done.label}: building commit {done.commit} failed ({step}: exit "
            f"{result.returncode}); see {build_log}"
        )


def _site_packages(python: Path) -> Path:
    """The site-packages of the virtual environment `python` runs in, as it says itself."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return Path(result.stdout.strip())


def _repoint_scripts(bin_dir: Path, old: str, new: str) -> None:
    """Rewrite the venv's path from `old` to `new` in the scripts of `bin_dir` (console-script
    shebangs, activate), before the folder moves there."""
    for path in bin_dir.iterdir():
        if path.is_symlink() or not path.is_file():
            continue
        text = path.read_bytes()
        if old.encode() in text:
            path.write_bytes(text.replace(old.encode(), new.encode()))
