"""The JSON body of a replica's HTTP answer that is neither text nor bytes.

As in Ray Serve, whatever ``json`` cannot write by itself goes through
FastAPI's ``jsonable_encoder`` (when FastAPI is installed) with Ray Serve's
extra encoders: numpy arrays and scalars, pandas data frames, exceptions.
Without FastAPI the common cases are converted here: mappings, pydantic
models, dataclasses, enums, sets and tuples, dates and times, UUIDs,
decimals, paths, and at last the object's attributes (as FastAPI
does).  Plain dicts, lists and numbers never reach the hook (one
shared encoder, made once: no per-answer set-up).
"""
import dataclasses
import datetime
import decimal
import enum
import json
import pathlib
import sys
import uuid
from collections.abc import Mapping


def _serve_encoded(obj):
    """Ray Serve's own encoders (before FastAPI's): a value, or ``_NONE``."""
    module = type(obj).__module__ or ""
    if module == "numpy" or module.startswith("numpy."):
        if hasattr(obj, "tolist"):          # arrays (ints and floats as Python's)
            return obj.tolist()
        if hasattr(obj, "item"):
            return obj.item()
    if module.startswith("pandas.") and hasattr(obj, "to_dict") and \
            type(obj).__name__ == "DataFrame":
        return obj.to_dict(orient="records")
    if isinstance(obj, BaseException):
        return str(obj)
    return _NONE


_NONE = object()


def _plain(obj):
    """The hand-made conversions, for a process without FastAPI."""
    if isinstance(obj, Mapping):
        return dict(obj)
    dump = getattr(obj, "model_dump", None)          # pydantic 2
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, (datetime.datetime, datetime.date, datetime.time)):
        return obj.isoformat()
    if isinstance(obj, datetime.timedelta):
        return obj.total_seconds()
    if isinstance(obj, (uuid.UUID, pathlib.PurePath)):
        return str(obj)
    if isinstance(obj, decimal.Decimal):
        return float(obj)
    if isinstance(obj, bytes):
        return obj.decode()
    # jsonable_encoder's last resorts: the object as a mapping, or its attributes.
    try:
        return dict(obj)
    except Exception:   # noqa: BLE001 - not a mapping nor pairs
        pass
    try:
        return dict(vars(obj))
    except TypeError:
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable") \
            from None


def _jsonable(obj):
    value = _serve_encoded(obj)
    if value is not _NONE:
        return value
    try:
        from fastapi.encoders import jsonable_encoder
    except ImportError:
        return _plain(obj)
    encoders = {BaseException: str}
    np = sys.modules.get("numpy")
    if np is not None:
        encoders[np.ndarray] = np.ndarray.tolist
        encoders[np.generic] = np.generic.item
    try:
        return jsonable_encoder(obj, custom_encoder=encoders)
    except ValueError:      # (FastAPI's: a list of what it tried) -> json's own error
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON "
                        f"serializable") from None


_encoder = json.JSONEncoder(separators=(",", ":"), default=_jsonable)


def json_body(obj):
    """``obj`` as the compact JSON bytes of an answer (TypeError naming the
    type when nothing can write it)."""
    return _encoder.encode(obj).encode()
