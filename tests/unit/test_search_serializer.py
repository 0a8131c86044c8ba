"""The OpenSearch client's JSON: the same requests and answers as the standard encoder's."""

from __future__ import annotations

import datetime as dt
import json
import uuid

import numpy as np
import pytest
from opensearchpy import JSONSerializer
from opensearchpy.exceptions import SerializationError

from shared.search.client import FastJSONSerializer

fast, standard = FastJSONSerializer(), JSONSerializer()


def test_a_chunk_source_reads_back_as_the_standard_encoder_writes_it() -> None:
    source = {
        "tenant_id": "t1",
        "doc_id": "dir/Ünïcödé – ✓.md",
        "text": 'quotes " and \\ backslashes, tabs\t, newlines\n, NUL \x00 and 𝄞',
        "embedding": [0.123456789, -1.0, 0.0, 1e-9, 3.4028234663852886e38],
        "metadata": {"n": 2**63 - 1, "neg": -(2**63), "f": 0.1, "flag": True, "none": None},
        "position": 3,
    }
    line = fast.dumps(source)
    assert "\n" not in line  # one line of a bulk body
    assert json.loads(line) == json.loads(standard.dumps(source)) == source


def test_what_the_standard_encoder_turns_into_json_this_one_does_alike() -> None:
    when = dt.datetime(2026, 12, 5, 21, 30, 1, 250, tzinfo=dt.UTC)
    data = {
        "when": when,
        "day": dt.date(2026, 12, 5),
        "id": uuid.UUID(int=7),
        "vector": np.array([0.5, -0.25], dtype=np.float32),
        "count": np.int64(3),
    }
    assert json.loads(fast.dumps(data)) == json.loads(standard.dumps(data))


def test_what_orjson_refuses_goes_the_standard_way() -> None:
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    assert json.loads(fast.dumps(deep)) == deep
    with pytest.raises(SerializationError):
        fast.dumps({"x": object()})


def test_answers_keep_integers_past_64_bits() -> None:
    big = 2**70 + 1  # a float would round it
    hits = '{"hits":[{"_id":"a","_score":1.5,"_source":{"text":"é"}}]}'
    answer = fast.loads(f'{{"took":3,"hits":{hits},"n":{big},"m":-{big}}}')
    assert answer["n"] == big
    assert type(answer["n"]) is int
    assert answer["m"] == -big
    assert answer["hits"]["hits"][0]["_source"]["text"] == "é"
    with pytest.raises(SerializationError):
        fast.loads("{broken")


def test_requests_keep_integers_past_64_bits() -> None:
    big = 2**70 + 1
    assert json.loads(fast.dumps({"metadata": {"n": big, "m": 2**64 - 1}})) == {
        "metadata": {"n": big, "m": 2**64 - 1}
    }


def test_a_body_given_as_text_is_sent_as_it_is() -> None:
    assert fast.dumps('{"query":{}}') == '{"query":{}}'
