"""Where weights come from: the name a user types resolved to a `WeightSource` of its kind
(`synthetic:<preset>`, a pulled model, an HF folder, a .gguf file)."""

from __future__ import annotations

from pathlib import Path

from llmbench.engine.checkpoint import WeightSource
from llmbench.errors import UserError

SYNTHETIC_PREFIX = "synthetic:"


def open_weights(model: str) -> WeightSource:
    """Resolve what a user typed: `synthetic:<preset>`, a pulled model name, a folder or a .gguf."""
    from llmbench.engine import model_store

    if model.startswith(SYNTHETIC_PREFIX):
        from llmbench.engine.synthetic import SyntheticSource

        return SyntheticSource(model.removeprefix(SYNTHETIC_PREFIX))
    if model in model_store.PULLABLE:
        return _open_path(model_store.pull(model))
    path = Path(model).expanduser()
    if not path.exists():
        known = ", ".join(sorted(model_store.PULLABLE))
        raise UserError(
            f"model '{model}': no such file or folder; give an HF folder, a .gguf file, "
            f"a pulled model ({known}) or synthetic:<preset>"
        )
    return _open_path(path)


def _open_path(path: Path) -> WeightSource:
    if path.is_dir():
        from llmbench.engine.hf_folder import HFFolderSource

        return HFFolderSource(path)
    if path.suffix == ".gguf":
        from llmbench.engine.gguf_file import GGUFSource

        return GGUFSource(path)
    raise UserError(f"model '{path}': not a folder or a .gguf file; give an HF folder or a GGUF")
