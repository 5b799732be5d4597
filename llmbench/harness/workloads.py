"""Chat, RAG and agentic sessions: a pure function of the workload spec, the seed and a tokenizer.

A session is a system prompt (plus, for `tools_as: api`, tool definitions) and a list of turns.
The driver sends turn k with every earlier turn and the model's *real* replies in the history, so
the context is the one a real conversation builds, not a pre-baked one. Text is real words with
an exact token count that survives decode → encode (a client and a server that re-tokenize
agree), and only what the workload means to share is shared: the system prompt, tool schemas,
and popular RAG documents; everything else differs per session and per seed, so no prefix-cache
hit comes from an accident.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from llmbench.errors import UserError
from llmbench.harness.records import Tool
from llmbench.harness.spec import AgenticWorkload, ChatWorkload, Dist, RagWorkload, WorkloadSpec

# What a workload may expand to: past any real benchmark, but a bound on the memory and the time
# of building it (here about 1 ms and 1 KB per session of 3 turns of 64 tokens: text is made at
# some 200,000 tokens/s). `spec_load` refuses a spec beyond them, naming the limit; a normal or
# lognormal draw beyond one (its tail) is clipped to it.
MAX_SESSIONS = 100_000  # sessions of one repetition (and warm-up requests)
MAX_TURNS = 1_000  # a chat session's turns, an agentic session's tool steps
MAX_TOKENS = 1_000_000  # one text or one reply (a prompt part, max_tokens)
MAX_DOCUMENTS = 10_000  # a rag corpus (each document drawn scans them all: ~20 ns each)
MAX_ZIPF_S = 10.0  # a rag corpus' popularity skew (10: all but the first few never drawn)
# Documents drawn for every rag query (`document_draws`) x the corpus: each draw scans every
# document's weight (~20 ns each here), so this is about 2 minutes of drawing.
MAX_DOCUMENT_SCANS = 5_000_000_000
MAX_DELAY_S = 3_600.0  # one think time or tool latency
MAX_WORKLOAD_TOKENS = 100_000_000  # all the text a run makes, every repetition (~0.5 GB)

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "more can about said up out time what some other into could very then than first made like "
    "water people may long over just year new way work world day life part place after back "
    "little only round man came show every good me give our under name through just form great "
    "think say help low line differ turn cause much mean before move right boy old too same tell "
    "does set three want air well also play small end put home read hand port large spell add "
    "even land here must big high such follow act why ask men change went light kind off need "
    "house picture try again animal point mother near build self earth father head stand own "
    "page should country found answer school grow study still learn plant cover food sun four "
    "between state keep eye never last let thought city tree cross farm hard start might story "
    "saw far sea draw left late run while press close night real north open seem together next "
    "white children begin got walk example ease paper group always music those both mark often "
    "letter until mile river car feet care second book carry took science eat room friend began "
    "idea fish mountain stop once base hear horse cut sure watch color face wood main enough "
    "plain girl usual young ready above ever red list though feel talk bird soon body dog family "
    "direct pose leave song measure door product black short numeral class wind question happen "
    "complete ship area half rock order fire south problem piece told knew pass since top whole "
    "king space heard best hour better true during hundred five remember step early hold west "
    "ground interest reach fast verb sing listen six table travel less morning ten simple several"
).split()


class Tokens:
    """The model's tokenizer, as the workload needs it: encode and decode."""

    def __init__(self, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str]):
        self.encode = encode
        self.decode = decode

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def text(self, num_tokens: int, rng: random.Random) -> str:
        """Real words whose encoding is exactly num_tokens long, and stays so after
        decode → encode (a client that re-tokenizes gets the same count)."""
        if num_tokens <= 0:
            return ""
        words: list[str] = []
        ids: list[int] = []
        while len(ids) < num_tokens:
            words += rng.choices(_WORDS, k=max(8, num_tokens - len(ids)))
            ids = self.encode(" ".join(words))
        for keep in range(num_tokens, 0, -1):
            text = self.decode(ids[:keep])
            if self.encode(text) == ids[:keep]:
                return self._pad(text, num_tokens)
        raise UserError(f"workload: cannot make text of {num_tokens} tokens with this tokenizer")

    def _pad(self, text: str, num_tokens: int) -> str:
        """Append single-token fillers until the count is exact."""
        for _ in range(num_tokens):
            count = self.count(text)
            if count == num_tokens:
                return text
            for filler in (".", ",", " and", " a", "!"):
                if self.count(text + filler) == count + 1:
                    text += filler
                    break
            else:
                break
        if self.count(text) != num_tokens:
            raise UserError(f"workload: cannot make text of exactly {num_tokens} tokens")
        return text


def draw(dist: Dist, rng: random.Random) -> float:
    """One sample of a length or delay distribution, clipped to [min, max] when given."""
    if dist.dist == "fixed":
        value = dist.value
    elif dist.dist == "uniform":
        value = rng.uniform(dist.min, dist.max)
    elif dist.dist == "normal":
        value = rng.gauss(dist.mean, dist.std)
    elif dist.dist == "lognormal":
        # Parameterised by the distribution's own mean: mu = ln(mean) - sigma^2 / 2.
        mu = math.log(max(dist.mean, 1e-9)) - dist.sigma**2 / 2
        value = rng.lognormvariate(mu, dist.sigma)
    else:
        value = rng.choice(dist.values)
    if dist.min is not None and dist.dist != "uniform":
        value = max(value, dist.min)
    if dist.max is not None and dist.dist != "uniform":
        value = min(value, dist.max)
    return max(value, 0.0)


def draw_count(dist: Dist, rng: random.Random, limit: int = MAX_TOKENS) -> int:
    """A token or turn count: a sample rounded to an integer, at least 1 and at most `limit`
    (`MAX_TOKENS`; `MAX_TURNS` for turns)."""
    return min(limit, max(1, round(draw(dist, rng))))


def draw_delay(dist: Dist, rng: random.Random) -> float:
    """A think time or tool latency, in seconds: a sample, at most `MAX_DELAY_S`."""
    return min(MAX_DELAY_S, draw(dist, rng))


def upper_bound(dist: Dist) -> float:
    """The largest value `dist` draws (`max` when given), or for a normal or lognormal without
    a `max`, its mean: what a spec is checked against, and what `workload_tokens` counts."""
    if dist.dist == "fixed":
        return dist.value
    if dist.dist == "empirical":
        return max(dist.values)
    if dist.max is not None:
        return dist.max
    return dist.mean


def document_draws(spec: RagWorkload) -> float:
    """About how many draws `_rag_turns` makes, at most, to find one query's `docs_per_query`
    distinct documents: the k-th new one takes 1 / (1 − P_k) draws on average, P_k the share
    of popularity the documents already drawn hold, at most that of the k most popular."""
    weights = [1.0 / (i + 1) ** spec.zipf_s for i in range(spec.num_documents)]  # decreasing
    total, taken, draws = sum(weights), 0.0, 0.0
    for k in range(min(spec.docs_per_query, len(weights))):
        left = total - taken
        draws += total / left if left > 0 else math.inf
        taken += weights[k]
    return draws


def workload_tokens(spec: WorkloadSpec, num_sessions: int) -> int:
    """The tokens of text building `num_sessions` sessions of `spec` makes, at most (normal and
    lognormal lengths without a `max` count their mean): the shared prompt, schemas and corpus
    once, each session's own texts once per session."""

    def count(dist: Dist, limit: int = MAX_TOKENS) -> int:
        return min(limit, max(1, round(upper_bound(dist))))

    shared = spec.system_prompt_tokens
    own = count(spec.user_tokens)
    if isinstance(spec, ChatWorkload):
        own *= count(spec.turns, MAX_TURNS)
    elif isinstance(spec, RagWorkload):
        shared += spec.num_documents * count(spec.document_tokens)
    else:
        shared += spec.tool_schema_tokens
        steps = min(MAX_TURNS, round(upper_bound(spec.tool_steps)))
        own += steps * (count(spec.tool_result_tokens) + _QUERY_TOKENS)
    return shared + num_sessions * own


@dataclass(frozen=True)
class ToolCall:
    """The tool call the workload puts in the model's previous reply (`tools_as: api`)."""

    call_id: str
    name: str  # one of the session's tools
    arguments: str  # a JSON object, as the API carries it: a string

    def as_api(self) -> dict:
        """The entry of an assistant message's `tool_calls`."""
        return {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Turn:
    """One model call of a session."""

    content: str  # the new user message, or the tool's result
    max_tokens: int
    delay_s: float  # think time or tool latency before it is sent (0 for the first turn)
    is_tool_result: bool = False
    # `tools_as: api`: the call the previous reply made; `content` goes back as a `tool` message.
    tool_call: ToolCall | None = None


@dataclass(frozen=True)
class Session:
    session_id: str
    system_prompt: str
    turns: tuple[Turn, ...]
    tools: tuple[Tool, ...] | None = None  # `tools_as: api`: sent with every request


def build_sessions(spec: WorkloadSpec, seed: int, tokens: Tokens, salt: str = "") -> list[Session]:
    """The sessions of a workload; the same spec, seed, tokenizer and salt give the same list.

    `salt` changes every non-shared text but no length, count or delay: a salted workload has
    the same shape with other words (warm-up sessions use one so they never share prompts with
    the measured ones; so does each repetition of `--repeat`, so its spread is the machine's,
    not the workload's).
    """
    shared = random.Random(f"{seed}:shared")
    system = tokens.text(spec.system_prompt_tokens, shared)
    tools = None
    if isinstance(spec, AgenticWorkload):
        if spec.tools_as == "text":
            system = system + "\n\nTools:\n" + tokens.text(spec.tool_schema_tokens, shared)
        elif spec.tool_schema_tokens > 0:
            tools = tool_schemas(spec.tool_schema_tokens, shared, tokens)
    corpus = []
    if isinstance(spec, RagWorkload):
        corpus = [
            tokens.text(draw_count(spec.document_tokens, shared), shared)
            for _ in range(spec.num_documents)
        ]
    sessions = []
    for index in range(spec.sessions):
        # Two generators: `shape` draws lengths, counts, delays and choices (unsalted), `text`
        # draws the words (salted).
        shape = random.Random(f"{seed}:session:{index}")
        text = random.Random(f"{seed}:{salt}:session-text:{index}")
        if isinstance(spec, ChatWorkload):
            turns = _chat_turns(spec, shape, text, tokens)
        elif isinstance(spec, RagWorkload):
            turns = _rag_turns(spec, shape, text, tokens, corpus)
        else:
            turns = _agentic_turns(spec, shape, text, tokens, tools)
        sessions.append(Session(f"{salt}s{index}", system, tuple(turns), tools))
    return sessions


_TOKENS_PER_TOOL = 150  # a typical function definition: a name, a sentence or two, a parameter
_QUERY_TOKENS = 8  # the `query` argument of each tool call


def tool_schemas(num_tokens: int, rng: random.Random, tokens: Tokens) -> tuple[Tool, ...]:
    """OpenAI function definitions whose JSON text is about `num_tokens` tokens long.

    Each is `{"type": "function", "function": {"name", "description", "parameters"}}` with one
    required string parameter, `query`. One tool per ~150 tokens, fewer when the JSON skeleton of
    a tool alone (~65 tokens with a BPE vocabulary, ~200 with a byte-level one) would not fit;
    the descriptions share what the skeletons leave, and the last one is resized until
    `json.dumps(tools)` counts within a token of `num_tokens` (a tokenizer may merge a
    description's edge with the quote beside it). A budget below one skeleton gives one tool with
    a one-token description. A chat template wraps the definitions in text of its own, which the
    prompt counts on top.
    """

    def tool(name: str, description: str, query_doc: str) -> Tool:
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string", "description": query_doc}},
                    "required": ["query"],
                },
            },
        }

    def count(tools: list[Tool]) -> int:
        return tokens.count(json.dumps(tools))

    def name(i: int) -> str:
        return f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}_{i}"

    names, query_docs = [name(0)], [tokens.text(6, rng)]
    skeleton = count([tool(names[0], "", query_docs[0])])
    num_tools = max(1, min(round(num_tokens / _TOKENS_PER_TOOL), num_tokens // (skeleton + 1)))
    for i in range(1, num_tools):
        names.append(name(i))
        query_docs.append(tokens.text(6, rng))

    def schemas(descriptions: list[str]) -> list[Tool]:
        return [tool(*t) for t in zip(names, descriptions, query_docs, strict=True)]

    left = max(num_tools, num_tokens - count(schemas([""] * num_tools)))
    sizes = [left // num_tools + (i < left % num_tools) for i in range(num_tools)]
    descriptions = [tokens.text(n, rng) for n in sizes]
    for _ in range(4):  # each pass corrects by the last miss; one or two passes settle it
        miss = num_tokens - count(schemas(descriptions))
        if abs(miss) <= 1 or sizes[-1] + miss < 1:
            break
        sizes[-1] += miss
        descriptions[-1] = tokens.text(sizes[-1], rng)
    return tuple(schemas(descriptions))


def _chat_turns(
    spec: ChatWorkload, shape: random.Random, text: random.Random, tokens: Tokens
) -> list[Turn]:
    turns = []
    for k in range(draw_count(spec.turns, shape, MAX_TURNS)):
        delay = draw_delay(spec.think_time_s, shape) if k else 0.0
        turns.append(
            Turn(
                tokens.text(draw_count(spec.user_tokens, shape), text),
                draw_count(spec.output_tokens, shape),
                delay,
            )
        )
    return turns


def _rag_turns(
    spec: RagWorkload,
    shape: random.Random,
    text: random.Random,
    tokens: Tokens,
    corpus: list[str],
) -> list[Turn]:
    # Zipf popularity: document i is picked with weight 1 / (i + 1)^s.
    weights = [1.0 / (i + 1) ** spec.zipf_s for i in range(len(corpus))]
    chosen: list[int] = []
    while len(chosen) < spec.docs_per_query:
        (i,) = shape.choices(range(len(corpus)), weights=weights)
        if i not in chosen:
            chosen.append(i)
    documents = "\n\n".join(f"Document {i}:\n{corpus[i]}" for i in chosen)
    question = tokens.text(draw_count(spec.user_tokens, shape), text)
    content = f"{documents}\n\nQuestion: {question}"
    return [Turn(content, draw_count(spec.output_tokens, shape), 0.0)]


def _agentic_turns(
    spec: AgenticWorkload,
    shape: random.Random,
    text: random.Random,
    tokens: Tokens,
    tools: tuple[Tool, ...] | None,
) -> list[Turn]:
    """The task, then one turn per tool step: the tool's result, after the tool's latency. With
    `tools` (`tools_as: api`) each step also names the call the previous reply made."""
    task = tokens.text(draw_count(spec.user_tokens, shape), text)
    turns = [Turn(task, draw_count(spec.output_tokens, shape), 0.0)]
    num_steps = min(MAX_TURNS, round(draw(spec.tool_steps, shape)))
    for step in range(num_steps):
        result = tokens.text(draw_count(spec.tool_result_tokens, shape), text)
        is_last = step == num_steps - 1
        max_tokens = draw_count(spec.final_output_tokens if is_last else spec.output_tokens, shape)
        delay_s = draw_delay(spec.tool_latency_s, shape)
        if tools is None:
            turns.append(Turn(f"Tool result:\n{result}", max_tokens, delay_s, is_tool_result=True))
            continue
        call = ToolCall(
            call_id=f"call_{text.getrandbits(48):012x}",
            name=shape.choice(tools)["function"]["name"],
            arguments=json.dumps({"query": tokens.text(_QUERY_TOKENS, text)}),
        )
        turns.append(Turn(result, max_tokens, delay_s, is_tool_result=True, tool_call=call))
    return turns


def sessions_hash(sessions: list[Session]) -> str:
    """A digest of every text and number of the sessions (reproducibility checks)."""
    digest = hashlib.sha256()
    for s in sessions:
        digest.update(f"{s.session_id}\0{s.system_prompt}\0".encode())
        if s.tools is not None:
            digest.update(json.dumps(s.tools, sort_keys=True).encode())
        for t in s.turns:
            digest.update(
                f"{t.content}\0{t.max_tokens}\0{t.delay_s}\0{t.is_tool_result}\0".encode()
            )
            if t.tool_call is not None:
                call = t.tool_call
                digest.update(f"{call.call_id}\0{call.name}\0{call.arguments}\0".encode())
    return digest.hexdigest()[:16]


# Tokens a chat template adds per message (role markers, separators; SmolLM2's and Llama 3's
# take 4-6) and the workloads' own labels ("Tool result:", "Document 3:"), with room to spare.
TEMPLATE_TOKENS_PER_MESSAGE = 16
# `tools_as: api`: each assistant message's tool call (name, JSON arguments, markup), and the
# template's text around the tool definitions.
TOOL_CALL_TOKENS = 48
TOOLS_PREAMBLE_TOKENS = 128


def dist_max(dist: Dist) -> float | None:
    """The largest value `dist` can draw (`workloads.draw`): a uniform's max, a fixed value, an
    empirical list's largest, a normal's or lognormal's `max` clip; None when unbounded."""
    if dist.dist == "fixed":
        return dist.value
    if dist.dist == "empirical":
        return max(dist.values)
    return dist.max  # uniform: its max; normal, lognormal: the ceiling, when given


def longest_context_tokens(workload: WorkloadSpec) -> int | None:
    """The most tokens one request of `workload` can hold, prompt and output, chat template
    included (`TEMPLATE_TOKENS_PER_MESSAGE` per message); None when a length is unbounded.

    Formula, with every length at its `dist_max` and m messages:
    chat: system + turns · (user + output) + 16 m, m = 2 turns + 1;
    rag: system + docs_per_query · document + user + output + 16 m, m = 3 + docs_per_query;
    agentic: system + tool schemas + user + steps · (tool result + output) + final output
    + 16 m, m = 2 steps + 3 (and `tools_as: api` its calls and the tools' preamble).
    """
    system = workload.system_prompt_tokens
    user, output = dist_max(workload.user_tokens), dist_max(workload.output_tokens)
    if isinstance(workload, ChatWorkload):
        turns = dist_max(workload.turns)
        if None in (user, output, turns):
            return None
        turns = math.ceil(turns)
        body = system + turns * (user + output)
        num_messages = 2 * turns + 1
    elif isinstance(workload, AgenticWorkload):
        steps, result = dist_max(workload.tool_steps), dist_max(workload.tool_result_tokens)
        final = dist_max(workload.final_output_tokens)
        if None in (user, output, steps, result, final):
            return None
        steps = math.ceil(steps)
        body = system + workload.tool_schema_tokens + user + steps * (result + output) + final
        num_messages = 2 * steps + 3
        if workload.tools_as == "api":
            body += steps * TOOL_CALL_TOKENS + TOOLS_PREAMBLE_TOKENS
    else:  # rag: documents and a question in one user message
        document = dist_max(workload.document_tokens)
        if None in (user, output, document):
            return None
        body = system + workload.docs_per_query * document + user + output
        num_messages = 3 + workload.docs_per_query
    return math.ceil(body) + TEMPLATE_TOKENS_PER_MESSAGE * num_messages
