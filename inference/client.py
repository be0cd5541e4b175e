"""The async client the gateway and the indexer use to reach the sidecar.

It splits large inputs into requests within the sidecar's limits, applies a timeout per attempt,
retries with jittered exponential backoff on 429/502/503/504 and connection errors (honouring
``Retry-After``) and raises typed errors. Every request is built from the sidecar's own route
declarations (:mod:`inference.routes`): their paths, their field names, their defaults, so the two
ends of the contract cannot drift apart::

    SidecarError                  base
    ├── SidecarUnavailable        connection refused/reset, timeout, 502/503/504 after retries
    │   └── SidecarOverloaded     429 still after retries
    └── SidecarRejected           any other 4xx: the input is bad; never retried (status, code, message)
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import aiohttp
import numpy as np
import orjson

from .contract import Route
from .errors import ErrorCode
from .json_out import dumps
from .routes import EMBED, IMAGE, MODELS, OPENAI_EMBEDDINGS, READYZ, RERANK, TEXT, TOKENIZE

__all__ = [
    "EmbedResult",
    "ModelInfo",
    "OpenAIEmbeddings",
    "SidecarClient",
    "SidecarError",
    "SidecarOverloaded",
    "SidecarRejected",
    "SidecarUnavailable",
]

_RETRY_STATUSES = frozenset({429, 502, 503, 504})
_KNOWN_CODES = frozenset(code.value for code in ErrorCode)
_MAX_IMAGE_REQUEST_BYTES = 32 * 1024 * 1024  # raw bytes per /image request (body limit is 64 MiB base64)
_JSON_BODY = {"Content-Type": "application/json"}  # bodies through inference.json_out (orjson)
_PARALLEL_REQUESTS = 4  # split requests in flight at once; the sidecar batches them together
_VECTORS_AS = "base64"  # the encoding_format the client asks for: fewer bytes than JSON floats, exact


class SidecarError(Exception):
    """Base of every sidecar client error.

    ``status`` and ``code`` are the sidecar's answer when it gave one (None: no answer, such as a
    refused connection or a timeout, or an answer that broke the contract); ``retry_after`` is its
    ``Retry-After`` in seconds, when it sent one. A proxy (the gateway's ``/v1/embeddings``) passes
    them on.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: ErrorCode | str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


class SidecarUnavailable(SidecarError):
    """Connection refused/reset, timeout, or 502/503/504 after retries."""


class SidecarOverloaded(SidecarUnavailable):
    """Still 429 after retries."""


class SidecarRejected(SidecarError):
    """A 4xx other than 429: the input is bad and retrying will not help.

    ``code`` is an :class:`~inference.errors.ErrorCode` when the sidecar answered one (compare with
    the enum's members, never with substrings), or ``http_<status>`` from a peer that did not.
    """

    status: int
    code: ErrorCode | str

    def __init__(self, status: int, code: ErrorCode | str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}", status=status, code=code)
        self.message = message


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    id: str
    kind: str  # "text" | "image_text" | "rerank"
    dimension: int | None
    max_input_tokens: int | None
    device: str
    dtype: str
    # "dense", "sparse", "text", "image", "rerank": what the sidecar says the model can do
    capabilities: frozenset[str] = frozenset()

    @property
    def sparse(self) -> bool:
        """The model has a learned-sparse head (``return_sparse`` is accepted)."""
        return "sparse" in self.capabilities


@dataclasses.dataclass(frozen=True)
class OpenAIEmbeddings:
    """A ``POST /v1/embeddings`` answer as the sidecar gave it (OpenAI's shape, for a proxy to pass on
    unchanged) and the count a caller meters: its ``usage.prompt_tokens``."""

    body: dict[str, Any]
    prompt_tokens: int


@dataclasses.dataclass(frozen=True)
class EmbedResult:
    embeddings: np.ndarray  # float32, shape (n, dimension), L2-normalized
    model: str
    dimension: int
    tokens: int  # total tokens counted by the model (0 for images)
    sparse: list[dict[int, float]] | None = None


def _decode_vectors(rows: list[Any]) -> np.ndarray:
    if rows and isinstance(rows[0], str):
        return np.stack([np.frombuffer(base64.b64decode(r), dtype="<f4") for r in rows]).astype(np.float32)
    return np.asarray(rows, dtype=np.float32)


class SidecarClient:
    """One HTTP session to one sidecar. Use as ``async with SidecarClient(url) as client``."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        max_batch: int = 32,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_batch = max_batch
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SidecarClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._session = aiohttp.ClientSession(headers=headers)
        return self._session

    # -- transport -------------------------------------------------------------------------------

    async def _request(self, route: Route, **fields: Any) -> Any:
        """One logical call of ``route`` with retries; returns the decoded JSON body of a 2xx answer.
        A POST's body is ``fields`` as the route declares them (:meth:`~inference.contract.Route.body`)."""
        method, path = route.method, route.path
        payload = route.body(**fields) if method == "POST" else None
        url = f"{self.base_url}{path}"
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                async with self._http().request(
                    method,
                    url,
                    data=None if payload is None else dumps(payload),
                    headers=None if payload is None else _JSON_BODY,
                    timeout=aiohttp.ClientTimeout(total=self.timeout),
                ) as response:
                    if response.status < 300:
                        return orjson.loads(await response.read())
                    status = response.status
                    code, message = await self._error_body(response)
                    if status not in _RETRY_STATUSES:
                        if 400 <= status < 500:
                            raise SidecarRejected(status, code, message)
                        raise SidecarError(
                            f"{method} {path}: {status} {code}: {message}", status=status, code=code
                        )
                    retry_after = retry_after_seconds(response.headers.get("Retry-After"))
                    failure: SidecarUnavailable = (
                        SidecarOverloaded if status == 429 else SidecarUnavailable
                    )(
                        f"{method} {path}: {status} {code}: {message}",
                        status=status,
                        code=code,
                        retry_after=retry_after,
                    )
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
                failure = SidecarUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}")
            if attempt >= self.max_retries:
                raise failure
            # Full jitter (0..base*2^attempt), never sooner than the server asked.
            delay = random.uniform(0, min(5.0, 0.1 * 2**attempt))
            await asyncio.sleep(max(delay, retry_after or 0.0))
            attempt += 1

    @staticmethod
    async def _error_body(response: aiohttp.ClientResponse) -> tuple[ErrorCode | str, str]:
        try:
            body = await response.json(content_type=None)
            error = body["error"]
            code = str(error["code"])
            return (ErrorCode(code) if code in _KNOWN_CODES else code), str(error["message"])
        except Exception:
            text = (await response.text(errors="replace"))[:200]
            return f"http_{response.status}", text

    async def _map_chunks(self, chunks: Sequence[Any], call) -> list[Any]:
        """Run ``call(chunk)`` for every chunk, a few at a time, results in chunk order."""
        gate = asyncio.Semaphore(_PARALLEL_REQUESTS)

        async def one(chunk):
            async with gate:
                return await call(chunk)

        return list(await asyncio.gather(*(one(c) for c in chunks)))

    def _chunks(self, items: Sequence[Any]) -> list[Sequence[Any]]:
        return [items[i : i + self.max_batch] for i in range(0, len(items), self.max_batch)]

    @staticmethod
    def _result(
        model: str, answers: list[dict[str, Any]], expected: int, sparse: bool = False
    ) -> EmbedResult:
        rows = [_decode_vectors(a["embeddings"]) for a in answers]
        embeddings = np.concatenate(rows) if rows else np.zeros((0, 0), dtype=np.float32)
        if embeddings.shape[0] != expected:
            raise SidecarError(f"sidecar returned {embeddings.shape[0]} vectors for {expected} inputs")
        sparse_rows = None
        if sparse:
            sparse_rows = [{int(k): float(v) for k, v in row.items()} for a in answers for row in a["sparse"]]
        dimension = int(answers[0]["dimension"]) if answers else 0
        tokens = sum(int(a.get("usage", {}).get("tokens", 0)) for a in answers)
        return EmbedResult(embeddings, model, dimension, tokens, sparse_rows)

    # -- API -------------------------------------------------------------------------------------

    async def models(self) -> list[ModelInfo]:
        body = await self._request(MODELS)
        fields = [f.name for f in dataclasses.fields(ModelInfo)]
        return [
            ModelInfo(
                **{k: m.get(k) for k in fields if k != "capabilities"},
                capabilities=frozenset(m.get("capabilities") or ()),
            )
            for m in body["models"]
        ]

    async def ready(self) -> bool:
        try:
            async with self._http().request(
                READYZ.method,
                f"{self.base_url}{READYZ.path}",
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def embed(
        self,
        model: str,
        texts: Sequence[str],
        *,
        truncate: bool = EMBED.field("truncate").default,
        return_sparse: bool = EMBED.field("return_sparse").default,
    ) -> EmbedResult:
        async def call(chunk):
            return await self._request(
                EMBED,
                model=model,
                input=list(chunk),
                truncate=truncate,
                return_sparse=return_sparse,
                encoding_format=_VECTORS_AS,
            )

        answers = await self._map_chunks(self._chunks(texts), call)
        return self._result(model, answers, len(texts), sparse=return_sparse)

    async def openai_embeddings(
        self,
        model: str,
        texts: str | Sequence[str],
        *,
        encoding_format: str = OPENAI_EMBEDDINGS.field("encoding_format").default,
        dimensions: int | None = None,
    ) -> OpenAIEmbeddings:
        """One ``POST /v1/embeddings`` call, never split: its ``data[].index`` and ``usage`` are the
        sidecar's own, so a proxy passes the answer on as it came (more inputs than the model takes in
        one request is the sidecar's 413 ``too_many_inputs``). ``texts`` as a string is sent as one."""
        body = await self._request(
            OPENAI_EMBEDDINGS,
            model=model,
            input=texts if isinstance(texts, str) else list(texts),
            encoding_format=encoding_format,
            dimensions=dimensions,  # None: left out
        )
        expected = 1 if isinstance(texts, str) else len(texts)
        data = body.get("data") if isinstance(body, dict) else None
        usage = body.get("usage") if isinstance(body, dict) else None
        tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if not isinstance(data, list) or len(data) != expected:
            raise SidecarError(f"POST /v1/embeddings: the answer holds no {expected} embeddings")
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise SidecarError("POST /v1/embeddings: the answer reports no usage.prompt_tokens")
        return OpenAIEmbeddings(body, tokens)

    async def tokenize(self, model: str, texts: Sequence[str]) -> list[int]:
        async def call(chunk):
            return await self._request(TOKENIZE, model=model, input=list(chunk))

        answers = await self._map_chunks(self._chunks(texts), call)
        return [int(n) for a in answers for n in a["tokens"]]

    async def embed_images(self, model: str, images: Sequence[bytes]) -> EmbedResult:
        chunks: list[list[bytes]] = []
        size = 0
        for image in images:  # by count and by bytes, so a request stays under the body limit
            if (
                not chunks
                or len(chunks[-1]) >= self.max_batch
                or size + len(image) > _MAX_IMAGE_REQUEST_BYTES
            ):
                chunks.append([])
                size = 0
            chunks[-1].append(image)
            size += len(image)

        async def call(chunk):
            images = [base64.b64encode(b).decode("ascii") for b in chunk]
            return await self._request(IMAGE, model=model, images=images, encoding_format=_VECTORS_AS)

        answers = await self._map_chunks(chunks, call)
        result = self._result(model, answers, len(images))
        return dataclasses.replace(result, tokens=0)

    async def embed_image_texts(self, model: str, texts: Sequence[str]) -> EmbedResult:
        async def call(chunk):
            return await self._request(TEXT, model=model, input=list(chunk), encoding_format=_VECTORS_AS)

        answers = await self._map_chunks(self._chunks(texts), call)
        return self._result(model, answers, len(texts))

    async def rerank(self, model: str, query: str, documents: Sequence[str]) -> list[float]:
        async def call(chunk):
            return await self._request(RERANK, model=model, query=query, documents=list(chunk))

        answers = await self._map_chunks(self._chunks(documents), call)
        scores = [float(s) for a in answers for s in a["scores"]]
        if len(scores) != len(documents):
            raise SidecarError(f"sidecar returned {len(scores)} scores for {len(documents)} documents")
        return scores


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (None: absent or not a number of seconds)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
