"""Step `device`: the machine in its own words (card, driver, CUDA, torch, Triton,
transformers), its datasheet row, and the Python modules llmbench needs that are missing here
(on a fresh GPU machine with no network: the wheels to bring, docs/gpu-sitting.md).

    python -m benchmarks.gpu.device_info --work DIR
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import platform
import sys
from pathlib import Path

from benchmarks.gpu.part_records import PartWriter

# Import name → distribution: what llmbench's engine, CLI (which imports `serve`: aiohttp),
# run and tests (conftest: hypothesis) import, with the dependencies of the ones a GPU machine
# with torch, Triton, transformers, matplotlib, nvidia-ml-py and pytest may lack (gguf,
# hypothesis, aiohttp, prometheus_client, click, psutil): docs/gpu-sitting.md.
NEEDED = {
    "torch": "torch",
    "triton": "triton",
    "transformers": "transformers",
    "pytest": "pytest",
    "numpy": "numpy",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "jinja2": "jinja2",
    "matplotlib": "matplotlib",
    "yaml": "pyyaml",
    "pynvml": "nvidia-ml-py",
    "requests": "requests",
    "tqdm": "tqdm",
    "typing_extensions": "typing_extensions",
    "gguf": "gguf",
    "hypothesis": "hypothesis",
    "sortedcontainers": "sortedcontainers",
    "click": "click",
    "psutil": "psutil",
    "prometheus_client": "prometheus_client",
    "aiohttp": "aiohttp",
    "aiohappyeyeballs": "aiohappyeyeballs",
    "aiosignal": "aiosignal",
    "attr": "attrs",
    "frozenlist": "frozenlist",
    "multidict": "multidict",
    "propcache": "propcache",
    "yarl": "yarl",
    "idna": "idna",
    **({"async_timeout": "async-timeout"} if sys.version_info < (3, 11) else {}),
}


def missing_modules() -> list[str]:
    """Distributions of `NEEDED` whose module cannot be found."""
    return [dist for name, dist in NEEDED.items() if importlib.util.find_spec(name) is None]


def version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe() -> dict:
    """The device and its software, as plain data."""
    import torch

    from llmbench.roofline.datasheets import datasheet_name_of

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": version_of("triton"),
        "transformers": version_of("transformers"),
        "missing": missing_modules(),
        "device_type": "cuda" if torch.cuda.is_available() else "cpu",
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {
            "card": torch.cuda.get_device_name(0),
            "memory_bytes": props.total_memory,
            "num_sms": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}",
            "driver": _driver_version(),
        }
    else:
        from llmbench.kernels.cpu_info import cpu_name

        info["card"] = cpu_name()
    info["datasheet"] = datasheet_name_of(info["card"])
    return info


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception as error:  # no NVML: said, not fatal
        return f"unknown ({type(error).__name__})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    info = describe()
    PartWriter(args.work / "device.jsonl").row("device", info)
    print(info)
    if info["missing"]:
        sys.exit(f"device: missing modules {', '.join(info['missing'])} (docs/gpu-sitting.md)")


if __name__ == "__main__":
    main()
