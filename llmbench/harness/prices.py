"""Price sheets: what a provider charges per million tokens, by kind of token, for `cost`.

A sheet is a YAML file (or the name of a shipped example, `llmbench/prices/<name>.yaml`):

    name: my-provider large
    currency: USD
    as_of: "2026-11-01"            # the date the prices were read
    source: the provider's price page
    per_million_tokens:
      input: 3.00                  # uncached prompt tokens
      cache_write: 3.75            # prompt tokens written to the provider's cache (omit: input)
      cache_hit: 0.30              # prompt tokens read from it (omit: input, no discount)
      output: 15.00
      reasoning: 15.00             # reasoning output (omit: output)

The shipped sheets are list prices of public APIs on the date they say, marked `is_example`:
examples of the format and of the economics, not quotes — a run priced with one says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmbench.errors import UserError
from llmbench.harness.plain_data import from_plain
from llmbench.harness.yaml_source import SpecError, located, read_yaml

SHIPPED = Path(__file__).resolve().parents[1] / "prices"
MAX_SHEET_BYTES = 64 * 1024


@dataclass(frozen=True)
class TokenPrices:
    """Per million tokens, in the sheet's currency; None: priced as `input` (cache) or `output`
    (reasoning)."""

    input: float
    output: float
    cache_write: float | None = None
    cache_hit: float | None = None
    reasoning: float | None = None


@dataclass(frozen=True)
class PriceSheet:
    name: str
    per_million_tokens: TokenPrices
    currency: str = "USD"
    as_of: str | None = None
    source: str | None = None
    is_example: bool = False  # a shipped list price: an example, not a quote

    @property
    def label(self) -> str:
        """`claude-sonnet-4 (example), USD list price as of 2025-05-22`."""
        date = f" as of {self.as_of}" if self.as_of else ""
        kind = "list price (an example, not a quote)" if self.is_example else "prices"
        return f"{self.name}, {self.currency} {kind}{date}"


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def sheet_path(name_or_path: str) -> Path:
    """A sheet's file: the path given, else the shipped example of that name; a one-line
    `UserError` naming both kinds when it is neither."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if "/" not in name_or_path and (SHIPPED / f"{name_or_path}.yaml").is_file():
        return SHIPPED / f"{name_or_path}.yaml"
    raise UserError(
        f"{name_or_path!r}: no such price sheet file, nor a shipped example (those are "
        f"{', '.join(shipped_names())}); give a price sheet YAML"
    )


def load_prices(name_or_path: str) -> PriceSheet:
    """The sheet `name_or_path` names, checked strictly: a mistake is one line with the file,
    line and key (`prices.yaml:5: per_million_tokens.output: missing`)."""
    path = sheet_path(name_or_path)
    try:
        if path.stat().st_size > MAX_SHEET_BYTES:
            raise UserError(f"{path}: over {MAX_SHEET_BYTES:,} bytes; give a price sheet YAML")
        text = path.read_text()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror}); give a price sheet YAML") from None
    data, lines = read_yaml(text, str(path))
    try:
        sheet = from_plain(PriceSheet, data)
        for key, value in vars(sheet.per_million_tokens).items():
            if value is not None and value < 0:
                raise SpecError(f"per_million_tokens.{key}", f"must be >= 0, got {value}")
    except SpecError as e:
        raise located(e, str(path), lines) from None
    return sheet
