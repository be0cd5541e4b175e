"""Synthetic chunk text with real term statistics, for corpora larger than the real sentences.

Drawn from real word frequencies (the ``wordfreq`` package's Zipfian lists) in the shared data
sets' languages, so posting lists are as long or short as a real archive's: a cycled corpus
(the same sentences again with a marker) makes every term common and one term universal.
"""

from __future__ import annotations

import numpy as np

__all__ = ["LANGUAGES", "zipf_texts"]

LANGUAGES = {"en": 0.5, "es": 0.3, "de": 0.2}  # the shared data sets' languages, by weight


def zipf_texts(n: int, rng: np.random.Generator, words_per_language: int = 30_000) -> list[str]:
    """``n`` texts of 8-120 words drawn by real word frequency (wordfreq), one language each."""
    import wordfreq

    langs = list(LANGUAGES)
    tables = {}
    for lang in langs:
        words = wordfreq.top_n_list(lang, words_per_language)
        freq = np.asarray([wordfreq.word_frequency(w, lang) for w in words], dtype=np.float64)
        # The cumulative distribution once per language: ``rng.choice(..., p=p)`` would check p and
        # sum it again for every text (30k words, a million texts). Drawing uniforms and searching
        # this cdf is what ``choice`` does itself, so the texts are the same for the same seed.
        cdf = (freq / freq.sum()).cumsum()
        tables[lang] = (np.asarray(words, dtype=object), cdf / cdf[-1])
    picks = rng.choice(len(langs), n, p=list(LANGUAGES.values()))
    lengths = np.clip(rng.lognormal(3.4, 0.6, n).astype(int), 8, 120)
    out = []
    for lang_i, length in zip(picks, lengths, strict=True):
        words, cdf = tables[langs[lang_i]]
        out.append(" ".join(words[cdf.searchsorted(rng.random(length), side="right")]))
    return out
