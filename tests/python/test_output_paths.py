"""Output paths of the replay API that would overwrite an input."""

import os

import pytest

from servesim.replay import run_synthetic_trace_replay, run_trace_replay

REFUSED = "replay output paths must differ from each other and trace files"
ROWS = "".join(
    f'{{"timestamp": {i * 100}, "input_length": 64, "output_length": 4, "hash_ids": [{i}]}}\n' for i in range(4)
)


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text(ROWS)
    return path


def _refused(trace, **kw):
    with pytest.raises(ValueError) as e:
        run_trace_replay([str(trace)], **kw)
    assert str(e.value) == REFUSED
    # Refused before anything was opened for writing: the trace is whole.
    assert trace.read_text() == ROWS


def test_a_report_path_equal_to_the_trace_is_refused_before_the_trace_is_touched(trace):
    _refused(trace, report_jsonl_path=trace)
    _refused(trace, report_jsonl_path=str(trace.parent / "." / trace.name))


def test_a_report_path_linked_to_the_trace_is_refused(trace, tmp_path):
    soft = tmp_path / "soft.jsonl"
    soft.symlink_to(trace)
    _refused(trace, report_jsonl_path=soft)
    hard = tmp_path / "hard.jsonl"
    os.link(trace, hard)
    _refused(trace, report_jsonl_path=hard)
    # The trace given through a link, the report at the real file.
    with pytest.raises(ValueError, match=REFUSED):
        run_trace_replay([str(soft)], report_jsonl_path=trace)
    assert trace.read_text() == ROWS


def test_the_telemetry_file_must_differ_from_the_trace_and_the_report(trace, tmp_path):
    from servesim.replay import TelemetryOptions

    _refused(trace, telemetry_options=TelemetryOptions(sample_interval_ms=100.0, jsonl_path=trace))
    out = tmp_path / "out.jsonl"
    with pytest.raises(ValueError, match=REFUSED):
        run_trace_replay(
            [str(trace)], report_jsonl_path=out, telemetry_options=TelemetryOptions(sample_interval_ms=100.0, jsonl_path=out)
        )
    assert not out.exists()
    with pytest.raises(ValueError, match=REFUSED):
        run_synthetic_trace_replay(
            64, 4, 4, request_rate=10.0, report_jsonl_path=out,
            telemetry_options=TelemetryOptions(sample_interval_ms=100.0, jsonl_path=out),
        )
    assert not out.exists()


def test_a_distinct_report_path_is_written(trace, tmp_path):
    out = tmp_path / "records.jsonl"
    report = run_trace_replay([str(trace)], report_jsonl_path=out)
    assert report.summary["completed_requests"] == 4
    assert len(out.read_text().splitlines()) == 4
    assert trace.read_text() == ROWS
