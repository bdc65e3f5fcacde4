"""torch's dtypes by name, and the bytes of one element of each, without importing torch."""

from __future__ import annotations

ELEMENT_SIZES = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "float32": 4, "int64": 8, "float64": 8, "complex64": 8, "complex128": 16,
}
DTYPES = tuple(ELEMENT_SIZES)
