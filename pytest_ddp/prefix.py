"""How far the ranks' calls agree, from the first: the part of a long run the watchdog (after a
test) and the report can skip.  Pure.

Ranks usually make the same thousands of collectives and part ways near the end.  Comparing
them call by call in Python costs about a microsecond per call (5 seconds for 512 ranks of
10,000 calls); here each field is gathered into a list and the lists are compared by the
interpreter's C code, with no object made per call (a tuple per call also made the garbage
collector walk every call).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, count
from operator import attrgetter, ne

from .state import Call

# Calls equal in these are the same call of the same collective sequence (equal signatures:
# Call.signature reads a subset of them).
SAME_CALL = ("group", "seq", "op", "shapes", "dtypes", "root")


def shared_prefix(sequences: Sequence[Sequence[Call]], fields: Sequence[str] = SAME_CALL) -> int:
    """The number of leading positions at which every sequence's call equals the first
    sequence's in every one of ``fields``."""
    if not sequences:
        return 0
    reference = sequences[0]
    shared = min(len(s) for s in sequences)
    for name in fields:
        field = attrgetter(name)
        ours = list(map(field, reference[:shared]))
        for other in sequences[1:]:
            theirs = list(map(field, other[:shared]))
            if theirs != ours[:shared]:
                shared = next(compress(count(), map(ne, theirs, ours)))
    return shared
