"""What ``ask`` reads at start (``RAG_LLM_*``, ``RAG_RERANK_*``, ``RAG_EXPAND_*``, the context budget):
how it grounds, reranks, expands and generates, and what may leave the host. Composed into
:class:`~gateway.base.settings.GatewaySettings` as ``settings.ask``."""

from __future__ import annotations

from dataclasses import dataclass

from schema.settings import SettingsError, setting

PROVIDERS = ("extractive", "openai")


@dataclass(frozen=True)
class AskSettings:
    """How ``ask`` grounds, reranks, expands and generates, and what may leave the host."""

    context_token_budget: int = setting(
        "RAG_CONTEXT_TOKEN_BUDGET",
        3000,
        "Tokens of passage text handed to the generator (at least one passage is always kept). "
        "More context can answer more, but costs latency and dilutes the prompt.",
    )
    grounding_min_similarity: float = setting(
        "RAG_GROUNDING_MIN_SIMILARITY",
        0.2,
        "Cosine similarity a dense passage needs to ground an answer; below it on every passage, `ask` "
        "refuses without a model call. Model-dependent: 0.2 suits all-MiniLM-L6-v2, bge-m3 wants ~0.45.",
    )
    rerank_default: bool = setting(
        "RAG_ASK_RERANK",
        True,
        "Rerank `ask` candidates with the sidecar's cross-encoder unless the request says `rerank: false`.",
        tradeoff="Off saves a sidecar call per `ask`, for a less precise passage order.",
    )
    rerank_depth: int = setting(
        "RAG_RERANK_DEPTH",
        0,
        "Fused candidates the cross-encoder reorders before the cut to `limit` (0: just the `limit` "
        "best, so reranking changes the order, never the set). Deeper lets a good cross-encoder "
        "promote candidates; with a weak one it lets noise in.",
    )
    rerank_timeout: float = setting(
        "RAG_RERANK_TIMEOUT",
        5.0,
        "Seconds a rerank may take; slower or failing, the fused order is used (`reranked: false`).",
        tradeoff="Lower bounds `ask`'s latency under a slow sidecar, for more answers in fused order.",
    )
    expand_neighbours: int = setting(
        "RAG_EXPAND_NEIGHBOURS",
        1,
        "Chunks taken on each side of a passage by `expand: neighbours`.",
        tradeoff="More gives each passage more of its surroundings, for more of the token budget.",
    )
    expand_parent_chunks: int = setting(
        "RAG_EXPAND_PARENT_CHUNKS",
        12,
        "Most chunks `expand: parent` gathers from a passage's parent section (nearest first).",
        tradeoff="More gathers more of a long section, for more of the token budget.",
    )
    provider: str = setting(
        "RAG_LLM_PROVIDER",
        "extractive",
        "`extractive` (offline: sentence selection with the text model, no language model) or `openai` "
        "(any OpenAI-compatible chat-completions server at `RAG_LLM_ENDPOINT`).",
        tradeoff="`openai` writes answers with a language model; `extractive` needs none and sends nothing off the host.",
    )
    llm_endpoint: str | None = setting(
        "RAG_LLM_ENDPOINT",
        None,
        "Base URL of the OpenAI-compatible server (`.../v1`); `/chat/completions` is appended.",
        tradeoff="Set it with `RAG_LLM_PROVIDER=openai`; a host that is not local makes generation external egress.",
    )
    llm_model: str | None = setting(
        "RAG_LLM_MODEL",
        None,
        "Model name sent to the chat-completions server.",
        tradeoff="Name what the server serves: a larger model answers better, slower and at more cost.",
    )
    llm_api_key: str | None = setting(
        "RAG_LLM_API_KEY",
        None,
        "Bearer key for the chat-completions server (unset: no Authorization).",
        tradeoff="Set it for a server that requires a key; keep it out of files under version control.",
    )
    llm_temperature: float = setting(
        "RAG_LLM_TEMPERATURE",
        0.1,
        "Sampling temperature: low keeps answers close to the passages.",
        tradeoff="Higher varies the wording more and strays further from the passages.",
    )
    llm_timeout: float = setting(
        "RAG_LLM_TIMEOUT",
        60.0,
        "Seconds a generation may take before `rag.generation_failed`; streaming applies it per chunk.",
        tradeoff="Lower fails sooner on a stalled server; too low cuts off a slow model's long answers.",
    )
    llm_max_output_tokens: int = setting(
        "RAG_LLM_MAX_OUTPUT_TOKENS",
        512,
        "Upper bound of generated tokens (`max_tokens`).",
        tradeoff="More allows longer answers, for latency and cost per call.",
    )
    llm_system_prompt: str | None = setting(
        "RAG_LLM_SYSTEM_PROMPT",
        None,
        "System prompt when the section descriptor has none (unset: the built-in grounded-citation prompt).",
        tradeoff="Set it to change the tone or citation style of every section that has no prompt of its own.",
    )
    llm_locality: str = setting(
        "RAG_LLM_LOCALITY",
        "auto",
        "`auto` (loopback and `RAG_LOCAL_PROVIDER_HOSTS` are local, anything else external), `local` or "
        "`external`: say `external` for a loopback proxy or tunnel to a hosted API.",
        tradeoff="`external` makes the egress rules apply to a local address that forwards elsewhere.",
    )
    extractive_sentences: int = setting(
        "RAG_EXTRACTIVE_SENTENCES",
        3,
        "Sentences the extractive provider puts in an answer.",
        tradeoff="More covers more of the passages, for a longer, less focused answer.",
    )
    allow_external_default: bool = setting(
        "RAG_ALLOW_EXTERNAL_PROVIDER_DEFAULT",
        False,
        "Whether passages may be sent to an external (non-local) generator. Off: only sections whose "
        "descriptor says `egress.allow_external: true` may leave the host.",
    )
    forbidden_sections: tuple[str, ...] = setting(
        "RAG_EXTERNAL_PROVIDER_FORBIDDEN_SECTIONS",
        (),
        "Comma-separated sections whose text never goes to an external generator, including text they "
        "contribute to another section's group document.",
        tradeoff="List the sections whose text must never leave the host, whatever their descriptors say.",
    )
    local_hosts: tuple[str, ...] = setting(
        "RAG_LOCAL_PROVIDER_HOSTS",
        (),
        "Comma-separated generator hosts treated as local besides loopback (an in-house vLLM server).",
    )

    def validate(self) -> None:
        if self.provider not in PROVIDERS:
            raise SettingsError(f"RAG_LLM_PROVIDER={self.provider!r}: use one of {', '.join(PROVIDERS)}")
        if self.provider == "openai" and not (self.llm_endpoint and self.llm_model):
            raise SettingsError("RAG_LLM_PROVIDER=openai needs RAG_LLM_ENDPOINT and RAG_LLM_MODEL")
        if self.llm_locality not in ("auto", "local", "external"):
            raise SettingsError(f"RAG_LLM_LOCALITY={self.llm_locality!r}: use auto, local or external")
        if self.llm_endpoint is not None and not self.llm_endpoint.startswith(("http://", "https://")):
            raise SettingsError("RAG_LLM_ENDPOINT must be an http(s) URL")
        for name, value, low in (
            ("RAG_CONTEXT_TOKEN_BUDGET", self.context_token_budget, 1),
            ("RAG_RERANK_DEPTH", self.rerank_depth, 0),
            ("RAG_EXPAND_NEIGHBOURS", self.expand_neighbours, 0),
            ("RAG_EXPAND_PARENT_CHUNKS", self.expand_parent_chunks, 1),
            ("RAG_LLM_MAX_OUTPUT_TOKENS", self.llm_max_output_tokens, 1),
            ("RAG_EXTRACTIVE_SENTENCES", self.extractive_sentences, 1),
        ):
            if value < low:
                raise SettingsError(f"{name} must be at least {low}")
        if self.rerank_timeout <= 0 or self.llm_timeout <= 0:
            raise SettingsError("RAG_RERANK_TIMEOUT and RAG_LLM_TIMEOUT must be positive")
        if not 0 <= self.llm_temperature <= 2:
            raise SettingsError("RAG_LLM_TEMPERATURE must be in [0, 2]")
