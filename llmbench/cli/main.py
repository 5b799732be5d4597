"""The `llmbench` command group and its entry point: user errors are one line, not a traceback."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import click

from llmbench.cli.ab import ab
from llmbench.cli.compare import compare
from llmbench.cli.generate import generate
from llmbench.cli.merge import merge
from llmbench.cli.models import inspect, models
from llmbench.cli.moe import moe
from llmbench.cli.profile import profile
from llmbench.cli.quality import quality
from llmbench.cli.roofline import hardware_command, roofline
from llmbench.cli.run import export, report, run
from llmbench.cli.serve import serve
from llmbench.errors import UserError
from llmbench.harness.run_folder import WriteFailed, write_failed

# What `pip install 'llmbench[engine]'` adds: report, compare, roofline and runs against a
# server work without it.
ENGINE_EXTRA = ("torch",)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llmbench")
def cli() -> None:
    """LLM-inference benchmarking and roofline profiling with a built-in engine."""


for command in (generate, run, report, export, serve, hardware_command, roofline, inspect, models):
    cli.add_command(command)
cli.add_command(compare)
cli.add_command(ab)
cli.add_command(merge)
cli.add_command(quality)
cli.add_command(profile)
cli.add_command(moe)


# A disk with no room (a quota), or one mounted read-only: never a bug, so never a traceback,
# wherever a write meets it (the reports name their file; `run` raises a `WriteFailed`).
CANNOT_WRITE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def main() -> None:
    """Entry point: user errors become one line on stderr and exit code 2, never a traceback;
    a write that failed (a full disk) one line naming the file and the space left, exit 1."""
    try:
        cli(standalone_mode=False)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except WriteFailed as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except OSError as e:
        if e.errno not in CANNOT_WRITE:
            raise
        if e.filename:  # a write no command turned into a `WriteFailed` itself
            click.echo(f"error: {write_failed(Path(e.filename), e)}", err=True)
        else:
            click.echo(f"error: a write failed ({e.strerror})", err=True)
        sys.exit(1)
    except ModuleNotFoundError as e:
        if e.name not in ENGINE_EXTRA:
            raise
        click.echo(
            f"error: this command runs the built-in engine, which needs {e.name}: "
            "pip install 'llmbench[engine]'",
            err=True,
        )
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.exit(130)
