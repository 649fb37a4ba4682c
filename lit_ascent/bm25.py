"""BM25 retrieval over short texts, deterministic: WebShop's product search and the procedural memory.

WebShop's original searches a Lucene index (pyserini: BM25 with k1 0.9, b 0.4, English stop words and
Porter stemming) and shows the top 50 hits. This stands in for it with ``bm25s`` (pinned in
requirements.txt): its ``lucene`` variant is the same scoring formula, with the same k1 and b,
English stop words and the Snowball English stemmer (PyStemmer). bm25s is maintained, pure Python
over NumPy and scores the 1,000 products in well under a millisecond; rank-bm25 (the other
candidate) has only the Okapi variant and has not had a release since 2022. Ties are broken by the
texts' order, so a query always gives the same ranking; texts that share no term with the query
are not hits. WebShop's ranking approximates the original's, not equals it (another tokeniser
and stemmer).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

TOP_N = 50
"""Hits a search returns (WebShop's ``SEARCH_RETURN_N``)."""
K1, B = 0.9, 0.4
"""pyserini's BM25 defaults."""


class BM25Index:
    """BM25 over ``texts`` (one per id, in ``ids``' order)."""

    def __init__(self, ids: Sequence[str], texts: Sequence[str]):
        import bm25s
        import Stemmer

        self.ids = list(ids)
        self._stemmer = Stemmer.Stemmer("english")
        tokens = self._tokenize(list(texts))
        self._retriever = bm25s.BM25(method="lucene", k1=K1, b=B)
        self._retriever.index(tokens, show_progress=False)
        self._vocab = tokens.vocab
        words = {i: w for w, i in tokens.vocab.items()}
        self._text_terms = [frozenset(words[i] for i in ids) for ids in tokens.ids]
        self._df = Counter(term for terms in self._text_terms for term in terms)

    def _tokenize(self, texts: list[str]):
        import bm25s

        return bm25s.tokenize(texts, lower=True, stopwords="en", stemmer=self._stemmer, show_progress=False)

    def _query_terms(self, query: str) -> list[str]:
        """The query's terms, stemmed, stop words dropped (indexed or not)."""
        import bm25s

        return bm25s.tokenization.convert_tokenized_to_string_list(self._tokenize([query]))[0]

    def terms(self, query: str) -> list[str]:
        """The query's indexed terms (stemmed, stop words and unknown words dropped)."""
        return [w for w in self._query_terms(query) if w in self._vocab]

    def coverage(self, query: str) -> np.ndarray:
        """Per text, the share of the query's term weight it contains (0 to 1): the sum of Lucene's idf
        ``log(1 + (N - df + 0.5) / (df + 0.5))`` over the distinct query terms in the text, divided by
        the same sum over all of them (a term no text has counts with df 0). A term every text has
        weighs little, so two goals that share only "craft" cover little of each other."""
        terms = set(self._query_terms(query))
        n = len(self.ids)
        idf = {t: math.log(1 + (n - self._df[t] + 0.5) / (self._df[t] + 0.5)) for t in terms}
        total = sum(idf.values())
        if total == 0:
            return np.zeros(n)
        return np.array([sum(idf[t] for t in terms & text) / total for text in self._text_terms])

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every text for ``query`` (zeros when no term is indexed)."""
        terms = self.terms(query)
        if not terms:
            return np.zeros(len(self.ids))
        return np.asarray(self._retriever.get_scores(terms), dtype=np.float64)

    def search(self, query: str, top_n: int = TOP_N) -> list[str]:
        """The ids of the best ``top_n`` hits, best first; ties in the texts' order."""
        scores = self.scores(query)
        order = np.lexsort((np.arange(len(scores)), -scores))  # by score, then by position
        return [self.ids[i] for i in order[:top_n] if scores[i] > 0]
