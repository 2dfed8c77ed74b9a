"""What a deployment returns over HTTP, when it is not text or bytes, is
written as JSON as Ray Serve writes it: json's own types as they are, the
rest through FastAPI's jsonable_encoder (when installed) with Ray Serve's
encoders for numpy, pandas and exceptions, or through ray_lite's own
conversions without FastAPI; what nothing can write is a 500 naming it."""
import dataclasses
import datetime
import enum
import json
import sys
import uuid

import pytest

from ray_lite import serve
from ray_lite.serve._json import json_body
from serve_helpers import http

np = pytest.importorskip("numpy")


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Opaque:
    __slots__ = ()          # no attributes to write, and not a mapping


class Plain:
    def __init__(self):
        self.a = 1


CASES = [
    ({"a": 1, "b": [1.5, None, True]}, {"a": 1, "b": [1.5, None, True]}),
    (np.arange(3), [0, 1, 2]),
    ({"scores": np.array([0.5, 1.0]), "n": np.int64(7)}, {"scores": [0.5, 1.0], "n": 7}),
    (Point(1, 2.5), {"x": 1, "y": 2.5}),
    ((1, {2, }), [1, [2]]),
    (Color.RED, "red"),
    (datetime.date(2026, 12, 3), "2026-12-03"),
    (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
    (ValueError("bad input"), "bad input"),
    (Plain(), {"a": 1}),        # its attributes, as FastAPI's encoder does
]


@pytest.fixture(params=["fastapi", "without fastapi"])
def encoder(request, monkeypatch):
    if request.param == "fastapi":
        pytest.importorskip("fastapi")
    else:
        monkeypatch.setitem(sys.modules, "fastapi.encoders", None)   # import fails
    return request.param


@pytest.mark.parametrize("value, expected", CASES)
def test_values_are_written_as_ray_serve_writes_them(encoder, value, expected):
    assert json.loads(json_body(value)) == expected


def test_a_mapping_and_a_pydantic_model(encoder):
    from starlette.datastructures import QueryParams
    assert json.loads(json_body(QueryParams("a=1&b=2"))) == {"a": "1", "b": "2"}
    pydantic = pytest.importorskip("pydantic")

    class Item(pydantic.BaseModel):
        name: str
        when: datetime.date

    assert json.loads(json_body(Item(name="x", when=datetime.date(2026, 1, 2)))) == \
        {"name": "x", "when": "2026-01-02"}


def test_what_nothing_can_write_is_refused_naming_it(encoder):
    with pytest.raises(TypeError, match="Opaque"):
        json_body(Opaque())


def test_plain_values_are_compact():
    assert json_body({"a": [1, 2]}) == b'{"a":[1,2]}'


@serve.deployment
class Answers:
    def __call__(self, request):
        kind = request.query_params.get("kind")
        if kind == "query":
            return request.query_params
        if kind == "numpy":
            return {"v": np.arange(2), "mean": np.float64(0.5)}
        return Opaque()


def test_over_http(serve_port):
    serve.run(Answers.bind(), name="answers", route_prefix="/answers")
    status, headers, body = http(serve_port, "GET", "/answers?kind=query&x=y")
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"kind": "query", "x": "y"}
    status, _, body = http(serve_port, "GET", "/answers?kind=numpy")
    assert status == 200 and json.loads(body) == {"v": [0, 1], "mean": 0.5}
    status, _, body = http(serve_port, "GET", "/answers?kind=opaque")
    assert status == 500
