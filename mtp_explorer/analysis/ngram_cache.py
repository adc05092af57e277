"""llama.cpp's n-gram cache files (common/ngram-cache.{h,cpp}, 0.3.36) in Python: a writer of static cache files
for the ``ngram-cache`` drafter (whose drafts the engine makes, native_ext/ngram_cache_drafter.cpp, and the what-if
replays with the same code), and a reader.

A cache maps an n-gram (a tuple of :data:`LLAMA_NGRAM_MAX` tokens, the unused ones -1) to its *part*: the count of
each token seen after it. llama.cpp's caches are ``std::unordered_map`` types and its files list them in their
iteration order, so this module reproduces the order of libstdc++'s ``unordered_map`` (:func:`libstdcxx_order`) from
the order in which keys were inserted (a Python ``dict`` keeps it): :func:`save` writes byte for byte what
llama.cpp's ``common_ngram_cache_save`` writes, and :func:`write_static_cache` what ``llama-lookup-create`` writes
for the same tokens.

File format (``common_ngram_cache_save``, native byte order, which is little-endian on every platform llama.cpp
runs on): per n-gram, its 4 tokens as int32, then ``ntokens`` (int32), then ``ntokens`` pairs (token, count) of
int32, the n-grams and the pairs in the maps' iteration order.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..core.errors import ParameterError

LLAMA_NGRAM_MIN = 1  #: shortest n-gram of the context and dynamic caches
LLAMA_NGRAM_MAX = 4  #: longest n-gram, and the tokens of an n-gram record
LLAMA_NGRAM_STATIC = 2  #: the static cache's n-grams
TOKEN_NULL = -1  #: LLAMA_TOKEN_NULL, the unused places of an n-gram

#: libstdc++'s bucket counts as an ``unordered_map`` grows one insertion at a time from empty (1 bucket): it moves
#: to the next count when an insertion would make the elements outnumber the buckets (its _Prime_rehash_policy
#: with load factor 1; measured with g++ 12, whose libstdc++ builds llama.cpp and the engine here).
BUCKET_COUNTS = (
    13,
    29,
    59,
    127,
    257,
    541,
    1109,
    2357,
    5087,
    10273,
    20753,
    42043,
    85229,
    172933,
    351061,
    712697,
    1447153,
    2938679,
    5967347,
    12117689,
    24607243,
    49969847,
)

_MASK64 = (1 << 64) - 1
_FIBONACCI = 11400714819323198485

Ngram = tuple  #: an n-gram key: LLAMA_NGRAM_MAX tokens, -1 past its size
Part = dict  #: token -> count, in insertion order
Cache = dict  #: Ngram -> Part, in insertion order


def token_hash(token: int) -> int:
    """``std::hash<llama_token>``: the token as a size_t."""
    return token & _MASK64


def ngram_hash(ngram: Ngram) -> int:
    """``common_ngram_hash_function``: the tokens' Fibonacci hashes (as size_t) xor-ed."""
    h = 0
    for t in ngram:
        h ^= ((t & _MASK64) * _FIBONACCI) & _MASK64
    return h


def libstdcxx_order(keys: Iterable, hash_of: Callable[[Any], int]) -> list:
    """The iteration order of a libstdc++ ``unordered_map`` into which ``keys`` (distinct) were inserted in this
    order, one at a time from empty: a new key goes first in its bucket, or first of all when its bucket was
    empty; a rehash re-inserts the elements in iteration order."""
    order: list = []
    heads: list[int] = []  # buckets, most recently started last
    members: dict[int, list] = {}  # bucket -> its keys, most recent last
    n_bkt, grow = 1, iter(BUCKET_COUNTS)

    def insert(key, code: int) -> None:
        b = code % n_bkt
        if b in members:
            members[b].append(key)
        else:
            members[b] = [key]
            heads.append(b)

    codes: dict = {}
    for key in keys:
        if len(codes) + 1 > n_bkt:
            order = [k for b in reversed(heads) for k in reversed(members[b])]
            try:
                n_bkt = next(grow)
            except StopIteration:
                raise ParameterError(f"an n-gram cache map of more than {n_bkt} entries is beyond the replay") from None
            heads, members = [], {}
            for k in order:
                insert(k, codes[k])
        codes[key] = hash_of(key)
        insert(key, codes[key])
    return [k for b in reversed(heads) for k in reversed(members[b])]


def part_order(part: Part) -> list[tuple[int, int]]:
    """The (token, count) pairs of a part in llama.cpp's iteration order."""
    return [(t, part[t]) for t in libstdcxx_order(part, token_hash)]


def ngram_of(tokens: Sequence[int], start: int, size: int) -> Ngram:
    """The n-gram of ``size`` tokens at ``start`` (-1 before the sequence's start and past its size)."""
    return tuple(tokens[start + j] if j < size and start + j >= 0 else TOKEN_NULL for j in range(LLAMA_NGRAM_MAX))


def update(cache: Cache, ngram_min: int, ngram_max: int, inp: Sequence[int], nnew: int) -> None:
    """``common_ngram_cache_update``: the ngram_min- to ngram_max-grams of ``inp`` that end in its last ``nnew``
    tokens enter ``cache`` (each size in turn)."""
    n = len(inp)
    for size in range(ngram_min, ngram_max + 1):
        for i in range(max(n - nnew, size), n):
            part = cache.setdefault(ngram_of(inp, i - size, size), {})
            part[inp[i]] = part.get(inp[i], 0) + 1


# -- files -------------------------------------------------------------------------------------------------
_RECORD = struct.Struct(f"<{LLAMA_NGRAM_MAX}ii")  # an n-gram and its ntokens
_PAIR = struct.Struct("<ii")


def save(cache: Cache, path: str | os.PathLike) -> None:
    """``common_ngram_cache_save``: ``cache`` into ``path``, in llama.cpp's iteration order."""
    with open(path, "wb") as f:
        for ngram in libstdcxx_order(cache, ngram_hash):
            pairs = part_order(cache[ngram])
            f.write(_RECORD.pack(*ngram, len(pairs)))
            f.write(b"".join(_PAIR.pack(t, c) for t, c in pairs))


def load(path: str | os.PathLike, flag: str = "--lookup-cache-static") -> Cache:
    """``common_ngram_cache_load``, checked as the engine checks it: a file that cannot be read or is malformed (a
    truncated record, a token count or count below 1) is a :class:`ParameterError` naming it and ``flag``."""
    what = f"ngram-cache: the lookup cache {os.fspath(path)} ({flag})"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ParameterError(f"{what} cannot be read: {exc.strerror}") from None
    cache: Cache = {}
    pos, record = 0, 0
    while pos < len(data):
        if pos + _RECORD.size > len(data):
            raise ParameterError(f"{what} is malformed: the file ends in record {record}")
        *ngram, ntokens = _RECORD.unpack_from(data, pos)
        pos += _RECORD.size
        if ntokens < 1 or pos + ntokens * _PAIR.size > len(data):
            raise ParameterError(f"{what} is malformed: record {record} has a bad token count")
        part: Part = {}
        for token, count in _PAIR.iter_unpack(data[pos : pos + ntokens * _PAIR.size]):
            if count < 1:
                raise ParameterError(f"{what} is malformed: a count below 1 in record {record}")
            part.setdefault(token, count)
        pos += ntokens * _PAIR.size
        cache.setdefault(tuple(ngram), part)
        record += 1
    return cache


def write_static_cache(tokens: Sequence[int], path: str | os.PathLike) -> str:
    """A static n-gram cache of ``tokens`` (llama-lookup-create's: their 2-grams, ``LLAMA_NGRAM_STATIC``) written
    to ``path`` in llama.cpp's format, byte for byte what ``llama-lookup-create`` writes for the same tokens (it
    tokenizes the text of its ``-f`` file, less one final newline, with the model's tokenizer, beginning-of-sequence
    token and special tokens included: ``session.tokenize(text.removesuffix("\n"))`` for text without special
    tokens). Use it as ``lookup_cache_static=path`` (llama.cpp's ``-lcs``); returns ``path`` as ``str``."""
    cache: Cache = {}
    update(cache, LLAMA_NGRAM_STATIC, LLAMA_NGRAM_STATIC, [int(t) for t in tokens], len(tokens))
    save(cache, path)
    return os.fspath(path)
