"""Run record files: round trip, atomic writes, and clear errors for unusable input."""

from __future__ import annotations

import gzip
import json

import pytest

from attngroup.reports.record import RecordError, load_record, record_to_json, write_record
from tests.reports.records import make_metric, make_run, make_test


def test_round_trip(tmp_path):
    record = make_run(
        make_test(
            "a.py::test_x[triton-fp32]",
            "failed",
            message="boom",
            details="Traceback...",
            params={"backend": "triton", "tp": 1},
            fields={"backend": "triton", "tp": "1"},
            markers=("kernels",),
            attempts=("failed",),
            step="kernels",
        ),
        metrics=(make_metric((1.0, 1.1, 0.9), threshold=0.1),),
    )
    path = write_record(record, tmp_path / "run.json")
    loaded = load_record(path)
    assert loaded == record
    assert loaded.source == str(path)


def valid_document() -> dict:
    return record_to_json(make_run(make_test("a.py::test_x"), metrics=(make_metric(value=1.0),)))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        pytest.param(
            lambda d: d.pop("tests"), "required field 'tests' is missing", id="missing-tests"
        ),
        pytest.param(
            lambda d: d.update(schema="junit"), "'schema' is 'junit'", id="foreign-schema"
        ),
        pytest.param(
            lambda d: d.update(schema_version=99), "newer than this reader", id="newer-version"
        ),
        pytest.param(
            lambda d: d.update(kind="junit"), "kind: 'junit' is not one of", id="unknown-kind"
        ),
        pytest.param(lambda d: d.pop("kind"), "required field 'kind'", id="missing-kind"),
        pytest.param(
            lambda d: d["tests"][0].update(outcome="pass"),
            r"tests\[0\].outcome: 'pass' is not one of",
            id="bad-outcome",
        ),
        pytest.param(
            lambda d: d["tests"][0].update(duration_s="1s"),
            r"tests\[0\].duration_s: expected a number",
            id="string-duration",
        ),
        pytest.param(
            lambda d: d["metrics"][0].update(samples=[1.0, None]),
            r"metrics\[0\].samples\[1\]: expected a number, got null",
            id="null-sample",
        ),
        pytest.param(
            lambda d: d.update(environment=[]), "environment: expected an object", id="env-list"
        ),
        pytest.param(
            lambda d: d["metrics"][0].update(threshold=-0.1), "must be positive", id="neg-threshold"
        ),
    ],
)
def test_wrong_schema_names_the_field(tmp_path, mutate, message):
    document = valid_document()
    mutate(document)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    with pytest.raises(RecordError, match=message):
        load_record(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(None, "does not exist", id="missing"),
        pytest.param("", "is empty", id="empty"),
        pytest.param(
            '{"schema": "attention-grouping-run-record", "tests": [',
            "not valid JSON",
            id="truncated",
        ),
        pytest.param("[1, 2]", "expected a JSON object, got a list", id="list"),
    ],
)
def test_unreadable_input_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RecordError, match=message) as error:
        load_record(path)
    assert str(path) in str(error.value)


def test_a_gzip_compressed_record_reads_as_the_record(tmp_path):
    record = make_run(make_test("a.py::test_x", "passed"), metrics=(make_metric((1.0, 1.2)),))
    plain = write_record(record, tmp_path / "run.json")
    packed = tmp_path / "run.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert load_record(packed) == record


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        pytest.param(b"{not gzip}", "is not valid gzip", id="plain-text-named-gz"),
        pytest.param(gzip.compress(b'{"schema": 1}')[:-12], "is not valid gzip", id="truncated"),
        pytest.param(gzip.compress(b'{"tests": ['), "not valid JSON", id="truncated-json"),
    ],
)
def test_an_unusable_gzip_record_is_a_clear_error(tmp_path, payload, message):
    path = tmp_path / "run.json.gz"
    path.write_bytes(payload)
    with pytest.raises(RecordError, match=message) as error:
        load_record(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize(
    ("markers", "kind"),
    [
        pytest.param(("bench",), "benchmark", id="bench-cases"),
        pytest.param((), "pytest", id="tests"),
    ],
)
def test_version_1_record_gets_its_kind_from_its_tests(tmp_path, markers, kind):
    document = record_to_json(make_run(make_test("a::b", markers=markers)))
    del document["kind"]
    document["schema_version"] = 1
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    assert load_record(path).kind == kind


def test_run_labels_tell_two_runs_of_one_commit_apart():
    environment = {"git_sha": "a" * 40}
    first = make_run(run_id="1", created_at="2026-12-02T10:00:00+00:00", environment=environment)
    second = make_run(run_id="2", created_at="2026-12-02T10:07:30+00:00", environment=environment)
    assert first.label == "aaaaaaaa 12-02 10:00:00"
    assert second.label == "aaaaaaaa 12-02 10:07:30"
