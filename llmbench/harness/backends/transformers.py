"""Hugging Face `transformers.generate` as a baseline backend (optional dependency).

One request at a time (HF generate streams one sequence), on a worker thread, with the same
prompt token ids the engine would get (llmbench's tokenizer and chat template). A streamer
stamps every new token with `perf_counter_ns()` as generate hands it over.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

from llmbench.errors import UserError
from llmbench.harness.records import GenerationRequest, StreamEvent


class _TimedStreamer:
    """transformers streamer protocol: put(ids) per step (the prompt first), end() once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self._loop, self._queue = loop, queue
        self._seen_prompt = False

    def put(self, value) -> None:
        t_ns = time.perf_counter_ns()
        if not self._seen_prompt:
            self._seen_prompt = True  # generate() first echoes the prompt
            return
        ids = value.reshape(-1).tolist()
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (t_ns, ids))

    def end(self) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, None)


class TransformersBackend:
    name = "transformers"

    def __init__(self, model: str, dtype: str, threads: int | None):
        try:
            import torch
            import transformers
        except ImportError:
            raise UserError(
                "backend transformers: `pip install transformers accelerate` "
                "first (or install llmbench[reference])"
            ) from None
        from llmbench.engine import model_store
        from llmbench.engine.detokenizer import IncrementalDetokenizer
        from llmbench.engine.weights import open_weights

        if threads:
            torch.set_num_threads(threads)
        path = model_store.pull(model) if model in model_store.PULLABLE else Path(model)
        if not path.exists():
            raise UserError(
                f"backend transformers: model '{model}' must be a pulled model, an "
                f"HF folder or a .gguf file (synthetic weights are llmbench's own)"
            )
        kwargs = {"dtype": getattr(torch, dtype)}
        if path.suffix == ".gguf":
            folder, kwargs["gguf_file"] = path.parent, path.name
        else:
            folder = path
        self.model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs)
        self.tokenizer = open_weights(model).tokenizer()
        self._detokenizer_type = IncrementalDetokenizer
        self._lock = asyncio.Lock()  # one generate at a time
        self._torch = torch

    async def start(self) -> None:
        pass

    async def generate(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        if request.use_chat:
            prompt_ids = self.tokenizer.encode_chat(list(request.messages))
        else:
            prompt_ids = self.tokenizer.encode(request.prompt_text)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        kwargs = {
            "input_ids": self._torch.tensor([prompt_ids]),
            "attention_mask": self._torch.ones(1, len(prompt_ids), dtype=self._torch.long),
            "max_new_tokens": request.max_tokens,
            "do_sample": request.temperature > 0,
            "streamer": _TimedStreamer(loop, queue),
            "pad_token_id": self.tokenizer.eos_token_ids[0],
            "eos_token_id": list(self.tokenizer.eos_token_ids),
        }
        if request.temperature > 0:
            kwargs["temperature"] = request.temperature
        if request.ignore_eos:
            kwargs["min_new_tokens"] = request.max_tokens  # HF's way to run past EOS

        def run() -> None:
            try:
                self.model.generate(**kwargs)
            except Exception as e:  # noqa: BLE001 — handed to the consumer, which raises it
                loop.call_soon_threadsafe(queue.put_nowait, e)

        detokenizer = self._detokenizer_type(self.tokenizer)
        from llmbench.engine.omp_workers import release_omp_workers

        async with self._lock:
            worker = threading.Thread(target=run, daemon=True)
            release_omp_workers()  # this thread's OpenMP workers would slow the worker's 2x
            worker.start()
            num_tokens = 0
            while (item := await queue.get()) is not None:
                if isinstance(item, Exception):
                    raise RuntimeError(f"transformers generate failed: {item}")
                t_ns, ids = item
                num_tokens += len(ids)
                text = "".join(detokenizer.push(i) for i in ids)
                yield StreamEvent(t_ns=t_ns, num_tokens=len(ids), text=text)
            await asyncio.to_thread(worker.join)
        yield StreamEvent(
            t_ns=time.perf_counter_ns(),
            num_tokens=0,
            text=detokenizer.flush(),  # bytes held back for an unfinished character
            finish_reason="length" if num_tokens >= request.max_tokens else "stop",
            usage_prompt_tokens=len(prompt_ids),
            usage_completion_tokens=num_tokens,
        )

    async def close(self) -> None:
        pass
