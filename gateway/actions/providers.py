"""Answer generators for ``ask``: ``extractive`` (offline, no language model) and ``openai``.

Both see the same numbered passages and must mark every claim with ``[n]``.

- :class:`ExtractiveProvider` picks the passages' sentences that best answer
  the query (cosine similarity of the sidecar's text embeddings plus lexical
  overlap of the query's content words), each followed by its ``[n]``. It is a
  baseline, named as such (``used_provider: "extractive"``), not a language model.
- :class:`OpenAIProvider` posts to any OpenAI-compatible ``/chat/completions``
  (vLLM, llama.cpp's server, Ollama, a hosted API), optionally streamed.

Any transport or protocol failure is :class:`GenerationFailed`; the caller
answers ``rag.generation_failed`` and never substitutes another answer.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from gateway.base.ask_settings import AskSettings
from index.chunking.sentences import sentence_spans
from index.search.stopwords import strip_stopwords
from index.text import fold
from inference.client import ModelInfo, SidecarClient

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "ExtractiveProvider",
    "Generation",
    "GenerationFailed",
    "GenerationRequest",
    "OpenAIProvider",
    "Provider",
    "is_local_endpoint",
]

DEFAULT_SYSTEM_PROMPT = (
    "You answer questions about a heritage archive using only the numbered passages the user supplies. "
    "Mark every claim with the number of the passage that supports it in square brackets, like [2]. "
    "If the passages do not answer the question, say so plainly; never use outside knowledge or guess."
)

# Lexical overlap counts half as much as cosine similarity: enough to prefer the sentence that
# names the query's rare words (a name, a year) among semantically similar ones.
LEXICAL_WEIGHT = 0.5
# A sentence inherits part of its passage's retrieval similarity: a sentence that resembles the
# query out of context ("What do you remember?") loses to one from a passage that is on topic.
PASSAGE_WEIGHT = 0.5
# Sentences scoring below this share of the best one are left out rather than padding the answer.
RELATIVE_FLOOR = 0.7
# A sentence this close to one already chosen adds nothing.
REDUNDANT_COSINE = 0.92
MAX_SENTENCES_EMBEDDED = 256
_WORD_RE = re.compile(r"\w+")


class GenerationFailed(Exception):
    """The generator could not produce an answer (transport, status, protocol, timeout)."""


@dataclass(frozen=True)
class GenerationRequest:
    query: str
    system_prompt: str
    passages: Sequence[str]  # passage n is passages[n - 1]
    titles: Sequence[str] = ()
    similarities: Sequence[float | None] = ()  # each passage's dense similarity to the query, if known


@dataclass(frozen=True)
class Generation:
    text: str
    model: str
    usage: dict[str, Any] = field(default_factory=dict)


class Provider(Protocol):
    name: str
    local: bool

    @property
    def model(self) -> str: ...

    async def generate(self, request: GenerationRequest) -> Generation: ...

    def stream(self, request: GenerationRequest) -> AsyncIterator[str]: ...

    async def close(self) -> None: ...


def is_local_endpoint(url: str, local_hosts: Sequence[str] = ()) -> bool:
    """Loopback (``localhost``, 127.0.0.0/8, ``::1``) or a host the operator listed as local."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host in {h.lower() for h in local_hosts}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- extractive --------------------------------------------------------------------------------------

Embed = Callable[[Sequence[str]], Awaitable[tuple[str, np.ndarray]]]


def content_terms(text: str) -> set[str]:
    """Folded words of ``text`` without its language's stop words."""
    return set(strip_stopwords(_WORD_RE.findall(fold(text))))


def passage_sentences(text: str) -> list[str]:
    """The sentences of a passage; lines (transcription turns) never join."""
    out = []
    for line in text.splitlines():
        out.extend(line[a:b] for a, b in sentence_spans(line, 0, len(line)))
    return [s for s in out if _WORD_RE.search(s)]


class ExtractiveProvider:
    """Sentence selection from the passages; local by construction (nothing leaves the host)."""

    name = "extractive"
    local = True

    def __init__(self, embed: Embed, sentences: int) -> None:
        self._embed = embed  # (texts) -> (model id, L2-normalized rows)
        self.sentences = sentences
        self._model = "extractive"

    @property
    def model(self) -> str:
        return self._model

    async def generate(self, request: GenerationRequest) -> Generation:
        candidates = [(n, s) for n, text in enumerate(request.passages, 1) for s in passage_sentences(text)][
            :MAX_SENTENCES_EMBEDDED
        ]
        if not candidates:
            raise GenerationFailed("the passages hold no sentence")
        try:
            model_id, vectors = await self._embed([request.query, *(s for _, s in candidates)])
        except Exception as exc:  # the sidecar's errors: no answer rather than a worse one
            raise GenerationFailed(f"sentence embeddings unavailable: {exc}") from exc
        self._model = f"extractive ({model_id})"
        query, rows = vectors[0], vectors[1:]
        terms = content_terms(request.query)
        scores = []
        for (n, sentence), row in zip(candidates, rows, strict=True):
            overlap = len(terms & content_terms(sentence)) / len(terms) if terms else 0.0
            known = request.similarities[n - 1] if n <= len(request.similarities) else None
            scores.append(float(row @ query) + LEXICAL_WEIGHT * overlap + PASSAGE_WEIGHT * (known or 0.0))
        # A question in a passage (an interviewer's) rarely answers one; use them only when nothing else.
        statements = [i for i, (_, s) in enumerate(candidates) if not s.rstrip().endswith(("?", "？"))]
        pool = sorted(statements or range(len(candidates)), key=lambda i: (-scores[i], i))
        floor = scores[pool[0]] * RELATIVE_FLOOR if scores[pool[0]] > 0 else float("-inf")
        chosen: list[int] = []
        for i in pool:
            if len(chosen) == self.sentences or scores[i] < floor:
                break
            if all(float(rows[i] @ rows[j]) < REDUNDANT_COSINE for j in chosen):
                chosen.append(i)
        answer = " ".join(f"{candidates[i][1].strip()} [{candidates[i][0]}]" for i in chosen)
        return Generation(answer, self._model, {"sentences_scored": len(candidates)})

    async def stream(self, request: GenerationRequest) -> AsyncIterator[str]:
        yield (await self.generate(request)).text

    async def close(self) -> None:
        return None


# -- OpenAI-compatible chat completions --------------------------------------------------------------


def user_message(request: GenerationRequest) -> str:
    lines = ["Passages:"]
    for n, text in enumerate(request.passages, 1):
        title = request.titles[n - 1] if n <= len(request.titles) else ""
        lines.append(f"[{n}] {'(' + title + ') ' if title else ''}{' '.join(text.split())}")
    lines += ["", f"Question: {request.query}", "Answer from the passages only, citing them like [1]."]
    return "\n".join(lines)


class OpenAIProvider:
    """Chat completions over HTTP; local when the endpoint is loopback or listed as local."""

    name = "openai"

    def __init__(
        self,
        endpoint: str,
        model: str,
        *,
        api_key: str | None,
        temperature: float,
        timeout: float,
        max_tokens: int,
        local_hosts: Sequence[str] = (),
        locality: str = "auto",
    ) -> None:
        self.url = endpoint.rstrip("/") + "/chat/completions"
        self._model = model
        self.api_key = api_key
        self.temperature = temperature
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.local = locality == "local" or (locality == "auto" and is_local_endpoint(endpoint, local_hosts))
        self._session: aiohttp.ClientSession | None = None

    @property
    def model(self) -> str:
        return self._model

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._session = aiohttp.ClientSession(headers=headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _payload(self, request: GenerationRequest, stream: bool) -> dict[str, Any]:
        return {
            "model": self._model,
            "messages": [
                {"role": "system", "content": request.system_prompt},
                {"role": "user", "content": user_message(request)},
            ],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "stream": stream,
        }

    async def generate(self, request: GenerationRequest) -> Generation:
        try:
            async with self._http().post(
                self.url,
                json=self._payload(request, False),
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as response:
                if response.status >= 300:
                    raise GenerationFailed(f"chat completions answered {response.status}")
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
            raise GenerationFailed(f"chat completions unreachable: {type(exc).__name__}") from exc
        try:
            text = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise GenerationFailed("chat completions answered without choices[0].message.content") from exc
        if not isinstance(text, str) or not text.strip():
            raise GenerationFailed("chat completions answered an empty message")
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        return Generation(text, str(body.get("model") or self._model), usage)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[str]:
        """Content deltas of a streamed completion (server-sent events); the timeout applies per read."""
        try:
            async with self._http().post(
                self.url,
                json=self._payload(request, True),
                timeout=aiohttp.ClientTimeout(total=None, sock_read=self.timeout, sock_connect=self.timeout),
            ) as response:
                if response.status >= 300:
                    raise GenerationFailed(f"chat completions answered {response.status}")
                done = False
                async for raw in response.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    try:
                        delta = json.loads(data)["choices"][0].get("delta", {}).get("content")
                    except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
                        raise GenerationFailed("malformed stream event") from exc
                    if delta:
                        yield delta
                if not done:
                    raise GenerationFailed("the stream ended without [DONE]")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise GenerationFailed(f"chat completions stream failed: {type(exc).__name__}") from exc


# -- construction from settings ----------------------------------------------------------------------


def build_provider(
    settings: AskSettings, client: SidecarClient, text_model: Callable[[], Awaitable[ModelInfo]]
) -> Provider:
    """The configured generator. The extractive one embeds sentences on ``client`` with the text
    model ``text_model`` resolves at each answer (the retrieval's own, so sentence and query vectors
    share its space, a model-change swap included)."""
    if settings.provider == "openai":
        return OpenAIProvider(
            settings.llm_endpoint,
            settings.llm_model,
            api_key=settings.llm_api_key,
            temperature=settings.llm_temperature,
            timeout=settings.llm_timeout,
            max_tokens=settings.llm_max_output_tokens,
            local_hosts=settings.local_hosts,
            locality=settings.llm_locality,
        )

    async def embed(texts: Sequence[str]) -> tuple[str, np.ndarray]:
        model = await text_model()
        result = await client.embed(model.id, texts, truncate=True)
        return model.id, np.asarray(result.embeddings, dtype=np.float32)

    return ExtractiveProvider(embed, settings.extractive_sentences)
