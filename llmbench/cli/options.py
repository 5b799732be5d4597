"""Option types shared by several commands."""

from __future__ import annotations

import click

DTYPE = click.Choice(["float32", "bfloat16", "float16"])
DEVICE = click.Choice(["auto", "cpu", "cuda"])
