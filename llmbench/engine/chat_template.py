"""Chat messages -> prompt text through a model's jinja chat template, as transformers renders."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llmbench.errors import UserError


class ChatTemplate:
    """A compiled chat template; `render` gives the prompt text of a conversation."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._template = _compile_chat_template(source)

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> str:
        special = {"bos_token": bos_token, "eos_token": eos_token}
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                # A missing token is left undefined (renders "") rather than "None".
                **{name: token for name, token in special.items() if token is not None},
            )
        except jinja2.TemplateError as e:
            raise UserError(
                f"chat template failed: {_first_line(e)}: check the roles and order of the "
                "messages against what the model's template accepts"
            ) from e


def _compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in the environment transformers renders them in.

    Templates come from model repos and are untrusted code, hence the sandbox. trim_blocks and
    lstrip_blocks change the output whitespace, so they must match transformers for the same
    prompt text; so must the `tojson` override (no HTML escaping, non-ASCII kept).
    """
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise UserError(
            f"invalid chat template: line {e.lineno}: {e.message}: fix the template in the "
            "model's tokenizer files"
        ) from e


def _raise_exception(message: str) -> None:
    """`raise_exception("...")`, called by templates to reject a conversation."""
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    """Llama-3 templates print today's date."""
    return datetime.now().strftime(fmt)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
