"""The BM25 tokenizer of the reference, optional Snowball stemming, and line ranges.

The default pipeline is the reference's: lower-case, replace every character that is not a
Unicode letter, number, underscore or whitespace by a space, split on whitespace, drop tokens
shorter than ``min_length`` and stopwords. Lengths are counted as JavaScript counts them (UTF-16
code units), and whitespace is JavaScript's ``\\s``, so the tokens are the reference's tokens.
Stemming is an addition, off by default.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_STOPWORDS",
    "TokenizeOptions",
    "Tokenizer",
    "find_line_range",
    "line_finder",
    "make_tokenizer",
]

DEFAULT_STOPWORDS: frozenset[str] = frozenset(
    {
        "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "he", "in",
        "is", "it", "its", "of", "on", "or", "that", "the", "to", "was", "were", "will", "with",
    }
)  # fmt: skip

#: JavaScript's ``\s``: Python's ``\s`` differs (it has U+001C-U+001F and U+0085, lacks U+FEFF).
_JS_SPACE = "\t\n\v\f\r \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
DEFAULT_SPLIT_PATTERN = r"\s+"
_JS_SPLIT = re.compile(f"[{_JS_SPACE}]+")
# Python's ``\w`` on str is exactly Unicode categories L* and N* plus "_", the reference's
# ``[\p{L}\p{N}_]``.
_NOT_WORD_OR_SPACE = re.compile(f"[^\\w{_JS_SPACE}]")
_WORD_RUNS = re.compile(r"\w+")
_ASCII_WORD = re.compile(r"[A-Za-z0-9_]+")
_ASCII_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_ASCII_NON_WORD_TO_SPACE = bytes(
    byte if chr(byte).isalnum() or byte == ord("_") else ord(" ") for byte in range(128)
).ljust(256, b" ")

_OPTION_KEYS: dict[str, str] = {
    "lowercase": "lowercase",
    "remove_punctuation": "remove_punctuation",
    "removePunctuation": "remove_punctuation",
    "min_length": "min_length",
    "minLength": "min_length",
    "stopwords": "stopwords",
    "split_pattern": "split_pattern",
    "splitPattern": "split_pattern",
    "stem": "stem",
}


@dataclass(frozen=True, slots=True)
class TokenizeOptions:
    """Tokenizer settings; the defaults are the reference's.

    Parameters
    ----------
    lowercase
        Lower-case the text first.
    remove_punctuation
        Replace everything but letters, numbers, ``_`` and whitespace by a space.
    min_length
        Drop tokens shorter than this many UTF-16 code units (as JavaScript counts).
    stopwords
        Tokens to drop (compared after lower-casing, before stemming).
    split_pattern
        Regular expression the text is split on; the default ``\\s+`` is JavaScript's.
    stem
        ``False`` (default), ``True`` for Snowball English, or a Snowball language name such as
        ``"german"``. Needs PyStemmer (or snowballstemmer).
    """

    lowercase: bool = True
    remove_punctuation: bool = True
    min_length: int = 2
    stopwords: frozenset[str] = DEFAULT_STOPWORDS
    split_pattern: str = DEFAULT_SPLIT_PATTERN
    stem: bool | str = False

    def __post_init__(self) -> None:
        for name in ("lowercase", "remove_punctuation"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"tokenize option {name} must be a bool, got {getattr(self, name)!r}"
                )
        if isinstance(self.min_length, bool) or not isinstance(self.min_length, int):
            raise TypeError(f"tokenize option min_length must be an int, got {self.min_length!r}")
        if self.min_length < 0:
            raise ValueError(f"tokenize option min_length must be >= 0, got {self.min_length}")
        if not isinstance(self.stopwords, frozenset) or not all(
            isinstance(word, str) for word in self.stopwords
        ):
            raise TypeError("tokenize option stopwords must be a set of strings")
        if not isinstance(self.split_pattern, str):
            raise TypeError(
                f"tokenize option split_pattern must be a regular expression string, "
                f"got {self.split_pattern!r}"
            )
        try:
            re.compile(self.split_pattern)
        except re.error as exc:
            raise ValueError(
                f"tokenize option split_pattern {self.split_pattern!r} is not a valid regular "
                f"expression: {exc}"
            ) from exc
        stem: object = self.stem
        if stem is True:
            object.__setattr__(self, "stem", "english")
        elif stem is None:
            object.__setattr__(self, "stem", False)
        elif isinstance(stem, str) and stem:
            object.__setattr__(self, "stem", stem.lower())
        elif stem is not False:
            raise TypeError(f"tokenize option stem must be a bool or a language name, got {stem!r}")

    @classmethod
    def from_value(cls, value: Mapping[str, Any] | TokenizeOptions | None) -> TokenizeOptions:
        """Build options from ``None`` (defaults), options, or a mapping.

        Mapping keys may be snake_case or the reference's camelCase (``minLength``,
        ``removePunctuation``, ``splitPattern``). ``stopwords`` may be any iterable of strings and
        ``split_pattern`` a compiled pattern.

        Raises
        ------
        ValueError
            For an unknown key (the message names it) or a bad value.
        TypeError
            For a value of the wrong type, or ``value`` not a mapping.
        """
        if value is None:
            return cls()
        if isinstance(value, TokenizeOptions):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(
                f"tokenize options must be a mapping or TokenizeOptions, got {type(value).__name__}"
            )
        kwargs: dict[str, Any] = {}
        for key, item in value.items():
            name = _OPTION_KEYS.get(key)
            if name is None:
                known = ", ".join(sorted(set(_OPTION_KEYS.values())))
                raise ValueError(f"unknown tokenize option {key!r} (known: {known})")
            if name in kwargs:
                raise ValueError(f"tokenize option {name!r} given twice (as {key!r})")
            if name == "stopwords" and item is not None:
                if isinstance(item, str) or not isinstance(item, Iterable):
                    raise TypeError("tokenize option stopwords must be a set of strings")
                item = frozenset(item)
            elif name == "stopwords":
                item = frozenset()
            elif name == "split_pattern" and isinstance(item, re.Pattern):
                item = item.pattern
            kwargs[name] = item
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Return the options as JSON-friendly values (stopwords sorted), for recording."""
        return {
            "lowercase": self.lowercase,
            "remove_punctuation": self.remove_punctuation,
            "min_length": self.min_length,
            "stopwords": sorted(self.stopwords),
            "split_pattern": self.split_pattern,
            "stem": self.stem,
        }


class Tokenizer:
    """A tokenizer built from `TokenizeOptions`: ``tokenizer(text) -> list[str]``."""

    __slots__ = ("_ascii_drop", "_fast", "_split", "_stem_cache", "_stem_words", "options")

    options: TokenizeOptions

    def __init__(self, options: TokenizeOptions) -> None:
        self.options = options
        if options.split_pattern == DEFAULT_SPLIT_PATTERN:
            self._split: re.Pattern[str] = _JS_SPLIT
        else:
            self._split = re.compile(options.split_pattern)
        # With the default punctuation rule and split, the tokens are the runs of word
        # characters (min_length 0 keeps the empty strings a split leaves, so not then).
        self._fast = (
            options.remove_punctuation and self._split is _JS_SPLIT and options.min_length >= 1
        )
        self._stem_words: Callable[[list[str]], list[str]] | None = (
            _stemmer(options.stem) if isinstance(options.stem, str) else None
        )
        self._stem_cache: dict[str, str] = {}
        # Every ASCII word the filters drop, when there are few: the stopwords and, below a
        # minimum length of 2, the single characters. Counting then drops them with one set
        # intersection instead of a length and stopword test per distinct word.
        self._ascii_drop: frozenset[str] | None = (
            options.stopwords | (_ASCII_WORD_CHARS if options.min_length == 2 else frozenset())
            if self._fast and options.min_length <= 2
            else None
        )

    @property
    def tokens_are_substrings(self) -> bool:
        """Whether every token is a substring of the (lower-cased, if enabled) text."""
        return self._stem_words is None

    @property
    def words_are_ascii_runs(self) -> bool:
        """Whether the tokens of ASCII text are its runs of ``[A-Za-z0-9_]`` (lower-cased if
        enabled) that pass the length and stopword filters, nothing else."""
        return self._fast and self._stem_words is None

    def __call__(self, text: str) -> list[str]:
        opts = self.options
        if opts.lowercase:
            text = text.lower()
        minimum = opts.min_length
        stopwords = opts.stopwords
        if self._fast and text.isascii():
            # Same tokens as replace-then-split; ASCII lengths are UTF-16 lengths.
            words = text.encode("ascii").translate(_ASCII_NON_WORD_TO_SPACE).decode("ascii")
            tokens = [w for w in words.split() if len(w) >= minimum and w not in stopwords]
        elif self._fast:
            tokens = _filter(_WORD_RUNS.findall(text), minimum, stopwords)
        else:
            if opts.remove_punctuation:
                text = _NOT_WORD_OR_SPACE.sub(" ", text)
            tokens = _filter(self._split.split(text), minimum, stopwords)
        if self._stem_words is not None and tokens:
            return self._stem(tokens)
        return tokens

    def counts(self, text: str) -> tuple[dict[str, int], int]:
        """Return the term frequencies of ``text`` and its length in tokens.

        The same as counting ``self(text)``, faster: with the default split and punctuation
        rule the filters and the stemmer run once per distinct word instead of once per
        occurrence.
        """
        opts = self.options
        if not self._fast:
            tokens = self(text)
            return Counter(tokens), len(tokens)
        if opts.lowercase:
            text = text.lower()
        minimum = opts.min_length
        stopwords = opts.stopwords
        drop = self._ascii_drop
        if text.isascii():
            words = text.encode("ascii").translate(_ASCII_NON_WORD_TO_SPACE).decode("ascii")
            counts = Counter(words.split())
        else:
            # The same runs as __call__ finds, counted before filtering (once per distinct
            # word); a word shorter than the minimum may still pass by its UTF-16 length.
            counts = Counter(_WORD_RUNS.findall(text))
            for word in [w for w in counts if len(w) < minimum and _utf16_length(w) < minimum]:
                del counts[word]
            drop = stopwords
        if drop is not None:
            for word in counts.keys() & drop:
                del counts[word]
        else:
            for word in [w for w in counts if len(w) < minimum or w in stopwords]:
                del counts[word]
        if self._stem_words is not None and counts:
            words_list = list(counts)
            stemmed: dict[str, int] = {}
            for stem, word in zip(self._stem(words_list), words_list, strict=True):
                stemmed[stem] = stemmed.get(stem, 0) + counts[word]
            return stemmed, sum(stemmed.values())
        return counts, sum(counts.values())

    def _stem(self, words: list[str]) -> list[str]:
        # Snowball costs about a microsecond a word; most words repeat, so remember stems.
        assert self._stem_words is not None
        cache = self._stem_cache
        known = {w: cache.get(w) for w in set(words)}
        missing = [w for w, stem in known.items() if stem is None]
        if missing:
            if len(cache) > _STEM_CACHE_SIZE:
                cache = self._stem_cache = {}  # rebinding is atomic for other threads
            for word, stem in zip(missing, self._stem_words(missing), strict=True):
                known[word] = cache[word] = stem
        return [known[w] for w in words]  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"Tokenizer({self.options!r})"


def _filter(words: Iterable[str], minimum: int, stopwords: frozenset[str]) -> list[str]:
    return [
        w
        for w in words
        if (len(w) >= minimum or _utf16_length(w) >= minimum) and w not in stopwords
    ]


def _utf16_length(word: str) -> int:
    return len(word) + sum(1 for ch in word if ch > "\uffff")


_STEMMERS: dict[str, Callable[[list[str]], list[str]]] = {}
_STEM_CACHE_SIZE = 200_000


def _stemmer(language: str) -> Callable[[list[str]], list[str]]:
    """A Snowball ``stem_words`` for ``language``: PyStemmer's C build, else snowballstemmer."""
    found = _STEMMERS.get(language)
    if found is not None:
        return found
    stem_words: Callable[[list[str]], list[str]]
    try:
        import Stemmer  # type: ignore[import-not-found, unused-ignore]

        if language not in Stemmer.algorithms():
            raise ValueError(
                f"unknown stemming language {language!r} "
                f"(known: {', '.join(sorted(Stemmer.algorithms()))})"
            )
        stem_words = Stemmer.Stemmer(language).stemWords
    except ImportError:
        try:
            import snowballstemmer  # type: ignore[import-untyped, unused-ignore]
        except ImportError:
            raise ImportError(
                "tokenize option stem needs a Snowball stemmer: pip install PyStemmer"
            ) from None
        if language not in snowballstemmer.algorithms():
            raise ValueError(
                f"unknown stemming language {language!r} "
                f"(known: {', '.join(sorted(snowballstemmer.algorithms()))})"
            ) from None
        stem_words = snowballstemmer.stemmer(language).stemWords
    _STEMMERS[language] = stem_words
    return stem_words


def make_tokenizer(
    options: TokenizeOptions | Mapping[str, Any] | Callable[[str], list[str]] | None = None,
) -> Callable[[str], list[str]]:
    """Return a tokenizer: a custom callable as is, else a `Tokenizer` for the options.

    Raises
    ------
    ValueError, TypeError
        For bad options (see `TokenizeOptions.from_value`), or an unknown stemming language.
    ImportError
        When stemming is asked for and no Snowball stemmer is installed.
    """
    if options is None or isinstance(options, TokenizeOptions | Mapping):
        return Tokenizer(TokenizeOptions.from_value(options))
    if callable(options):
        return options
    raise TypeError(
        f"tokenize must be options, a mapping or a callable, got {type(options).__name__}"
    )


def find_line_range(
    content: str, query_tokens: Sequence[str], tokenize: Callable[[str], list[str]]
) -> tuple[int, int] | None:
    """Return the 1-based first and last lines of ``content`` holding any of ``query_tokens``.

    Each line (split on ``\\n``) is tokenized with ``tokenize``, as the reference does; None when no
    line matches or there are no query tokens. See `line_finder` (the same, prepared once for
    several contents).
    """
    return line_finder(query_tokens, tokenize)(content)


def line_finder(
    query_tokens: Sequence[str], tokenize: Callable[[str], list[str]]
) -> Callable[[str], tuple[int, int] | None]:
    """`find_line_range` for ``query_tokens``, prepared once for the hits of one query.

    With a `Tokenizer` that does not stem, every token is a substring of its (lower-cased)
    line, so only lines found by a substring search from either end are tokenized; when the
    tokens are runs of ASCII word characters too, an ASCII content needs no tokenizing at all.
    """
    if not query_tokens:
        return lambda content: None
    terms = frozenset(query_tokens)

    def by_lines(content: str) -> tuple[int, int] | None:
        split: list[str] = []

        def matches(i: int) -> bool:
            if not split:
                split.extend(content.split("\n"))  # only when a line must be tokenized
            return any(token in terms for token in tokenize(split[i]))

        if not substrings:
            count = content.count("\n") + 1
            found = next((i for i in range(count) if matches(i)), None)
            if found is None:
                return None
            last = next(i for i in range(count - 1, found - 1, -1) if i == found or matches(i))
            return found + 1, last + 1
        # lower() never adds or removes "\n", so line numbers in the haystack are the content's.
        haystack = content.lower() if lower else content
        first = _first_line(haystack, terms, matches)
        if first is None:
            return None
        return first + 1, _last_line(haystack, terms, matches, first) + 1

    known = tokenize if isinstance(tokenize, Tokenizer) else None
    substrings = known is not None and known.tokens_are_substrings
    lower = known is not None and known.options.lowercase
    if not (
        known is not None
        and known.words_are_ascii_runs
        and all(_ASCII_WORD.fullmatch(t) for t in terms)
    ):
        return by_lines
    words = tuple(terms)

    def by_words(content: str) -> tuple[int, int] | None:
        if not content.isascii():
            return by_lines(content)
        # The tokens of an ASCII line are its runs of [A-Za-z0-9_] that pass the filters, and
        # the query's tokens passed the same filters: a line holds one of them exactly when
        # the word occurs in it whole. The first and last whole occurrences (found with
        # str.find from either end, no line tokenized) give the range.
        haystack = content.lower() if lower else content
        return _word_span(haystack, words)

    return by_words


def _word_span(haystack: str, words: tuple[str, ...]) -> tuple[int, int] | None:
    """The 1-based lines of the first and last whole occurrences of any of ``words`` (runs of
    ASCII word characters) in the ASCII ``haystack``, or None."""
    first = last = -1
    for word in words:
        # Whole occurrences of different words are different runs, so only one starting
        # before the first found so far (after the last) can move it: search only there.
        bound = len(haystack) if first < 0 else first
        at = haystack.find(word, 0, bound)
        while at >= 0 and not _is_whole(haystack, at, at + len(word)):
            at = haystack.find(word, at + 1, bound)
        if at >= 0:
            first = at
        elif first < 0:
            continue  # not in the content at all: no last occurrence either
        at = haystack.rfind(word, last + 1)
        while at >= 0 and not _is_whole(haystack, at, at + len(word)):
            at = haystack.rfind(word, last + 1, at + len(word) - 1)
        if at >= 0:
            last = at
    if first < 0:
        return None
    start = haystack.count("\n", 0, first)
    return start + 1, start + haystack.count("\n", first, last) + 1


def _is_whole(haystack: str, at: int, end: int) -> bool:
    """Whether ``haystack[at:end]`` is not part of a longer run of ASCII word characters."""
    return (at == 0 or haystack[at - 1] not in _ASCII_WORD_CHARS) and (
        end == len(haystack) or haystack[end] not in _ASCII_WORD_CHARS
    )


def _first_line(haystack: str, terms: frozenset[str], matches: Callable[[int], bool]) -> int | None:
    pos = counted = line = 0
    while True:
        at = min((i for i in (haystack.find(t, pos) for t in terms) if i >= 0), default=-1)
        if at < 0:
            return None
        line += haystack.count("\n", counted, at)
        counted = at
        if matches(line):
            return line
        end = haystack.find("\n", at)
        if end < 0:
            return None
        pos = counted = end + 1
        line += 1


def _last_line(
    haystack: str, terms: frozenset[str], matches: Callable[[int], bool], first: int
) -> int:
    total = haystack.count("\n")
    end = counted = len(haystack)
    after = 0  # newlines in haystack[counted:]
    while True:
        at = max(haystack.rfind(t, 0, end) for t in terms)
        if at < 0:
            return first
        after += haystack.count("\n", at, counted)
        counted = at
        line = total - after
        if line <= first or matches(line):
            return max(line, first)
        end = haystack.rfind("\n", 0, at)
        if end < 0:
            return first
