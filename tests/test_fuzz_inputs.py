"""The mutation fuzzer of the importers and readers (#38), on a CI budget: 25 cases of each of its 12
targets (about 5 s after the worker's import), none a finding; and the findings of its longer runs,
each a case of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from facetrain.data.listfile import read_list_file
from facetrain.data.recordio import read_index
from facetrain.errors import FacetrainError
from tools.fuzz_inputs import TARGETS, fuzz

CASES_PER_TARGET = 25


@pytest.mark.timeout(120)
def test_a_bounded_fuzz_run_finds_nothing(tmp_path: Path) -> None:
    summary = fuzz(CASES_PER_TARGET, seed=0, work=tmp_path)
    assert summary["findings"] == []
    assert summary["cases"] == CASES_PER_TARGET * len(TARGETS)
    assert summary["seconds"] < 60


def test_the_fuzzer_reports_a_traceback_as_a_finding(tmp_path: Path, monkeypatch) -> None:
    """The harness itself: a reader that raises something else than FacetrainError is a finding."""
    import tools.fuzz_inputs as fuzz_inputs

    watch = fuzz_inputs._Watch(tmp_path)
    monkeypatch.setattr(fuzz_inputs, "_read", lambda target, path, out: {}["no such key"])
    outcome = fuzz_inputs.run_case("yaml", 0, 0, tmp_path, watch, timeout=10, max_mb=1024)
    assert outcome["result"] == "exception" and outcome["finding"] == "KeyError: 'no such key'"


def test_the_fuzzer_reports_a_read_outside_the_input(tmp_path: Path, monkeypatch) -> None:
    import tools.fuzz_inputs as fuzz_inputs

    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    watch = fuzz_inputs._Watch(tmp_path)
    monkeypatch.setattr(fuzz_inputs, "_read", lambda target, path, out: secret.read_text())
    outcome = fuzz_inputs.run_case("yaml", 0, 1, tmp_path, watch, timeout=10, max_mb=1024)
    assert outcome["finding"] == f"read {secret}"


@pytest.mark.parametrize("data", [b"path,label\n\xffann.png,0\n", b"path,label\n" + b"n" * 300 + b".png,0\n"])
def test_list_files_the_fuzzer_broke_are_one_line(tmp_path: Path, data: bytes) -> None:
    """Found by the fuzzer: a byte that is not UTF-8 (UnicodeDecodeError) and a 300-byte name
    (ENAMETOOLONG from the existence check) were tracebacks."""
    path = tmp_path / "list.csv"
    path.write_bytes(data)
    with pytest.raises(
        FacetrainError, match=rf"^list file {path}(: not UTF-8 text \(byte 11\); save it as UTF-8| line 2: )"
    ):
        read_list_file(path)


def test_a_recordio_index_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    """Found by the fuzzer: a mutated .idx was a UnicodeDecodeError traceback."""
    path = tmp_path / "train.idx"
    path.write_bytes(b"0\t0\n1\t\xff\n")
    with pytest.raises(FacetrainError, match=rf"^RecordIO index {path}: byte 6 is not text"):
        read_index(path)
