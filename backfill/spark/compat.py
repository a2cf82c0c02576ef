"""Which Spark result types may land in which column (checked at submit).

The target column's Spark type comes from Spark's own JDBC mapping of the
PostgreSQL type, so types Spark reads as strings (jsonb, uuid, inet, ...)
accept string results and PostgreSQL parses them when they land; the
submit-time dry run on sample rows catches values it would refuse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

_INTEGRAL_RANK = {"byte": 1, "short": 2, "integer": 3, "long": 4}


def can_land(src: DataType, dst: DataType) -> bool:
    """True when every ``src`` value converts to ``dst`` without loss."""
    from pyspark.sql import types as T

    s, d = src.typeName(), dst.typeName()
    # Anything can become text; varchar(n)/char(n): PostgreSQL checks the length.
    if src == dst or isinstance(src, T.NullType) or d in ("string", "varchar", "char"):
        return True
    if s in _INTEGRAL_RANK:
        if d in _INTEGRAL_RANK:
            return _INTEGRAL_RANK[s] <= _INTEGRAL_RANK[d]
        if isinstance(dst, T.DecimalType):
            digits = {1: 3, 2: 5, 3: 10, 4: 19}[_INTEGRAL_RANK[s]]
            return dst.precision - dst.scale >= digits
        return d in ("float", "double")
    if isinstance(src, T.DecimalType):
        if isinstance(dst, T.DecimalType):
            return (dst.scale >= src.scale
                    and dst.precision - dst.scale >= src.precision - src.scale)
        return d == "double"
    if s == "float":
        return d == "double"
    if s == "date":
        return d in ("timestamp", "timestamp_ntz")
    if s in ("timestamp", "timestamp_ntz"):
        return d in ("timestamp", "timestamp_ntz")
    return False


def landable(dst: DataType) -> bool:
    """Arrow's CSV writer (the landing path) handles flat types only."""
    from pyspark.sql import types as T

    return not isinstance(dst, T.ArrayType | T.MapType | T.StructType | T.BinaryType)
