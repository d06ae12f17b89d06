"""The mutation fuzzer of the importers and readers (#38, #57), on a CI budget: 25 cases of each of its
12 readers' targets and 3 of each of #57's four (about 5 s after the worker's import), none a finding;
and the findings of its longer runs, each a case of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from facetrain.data.listfile import read_list_file
from facetrain.data.recordio import RecordIOWriter, pack_image_record, read_index, scan_recordio
from facetrain.errors import FacetrainError
from facetrain.eval.csv_pairs import load_csv_pairs
from facetrain.eval.insightface_bin import load_insightface_bin
from facetrain.eval.lfw_pairs import load_lfw_pairs
from facetrain.interop.insightface_import import read_backbone_state
from facetrain.train.run_checks import validate
from facetrain.train.run_config import load_config
from tools.fuzz_cases import TARGETS, read_case
from tools.fuzz_features import TARGETS as FEATURE_TARGETS
from tools.fuzz_inputs import fuzz

CASES_PER_TARGET = 25
FEATURE_CASES = 3  # of each of #57's targets, slower a case (a checkpoint written, a model built)


@pytest.mark.timeout(120)
def test_a_bounded_fuzz_run_finds_nothing(tmp_path: Path) -> None:
    counts = {target: FEATURE_CASES if target in FEATURE_TARGETS else CASES_PER_TARGET for target in TARGETS}
    summary = fuzz(counts, seed=0, work=tmp_path)
    assert summary["findings"] == []
    assert summary["cases"] == sum(counts.values())
    # the targets of #57 (pack's output read back, teacher, timm, margin state) pass whole, not only refuse
    assert sum(summary["per_target"][target]["ok"] for target in FEATURE_TARGETS) > 0
    assert summary["seconds"] < 60


def test_the_fuzzer_reports_a_traceback_as_a_finding(tmp_path: Path, monkeypatch) -> None:
    """The harness itself: a reader that raises something else than FacetrainError is a finding."""
    import tools.fuzz_inputs as fuzz_inputs

    watch = fuzz_inputs._Watch(tmp_path)
    monkeypatch.setattr("tools.fuzz_cases.read_case", lambda target, path, out: {}["no such key"])
    outcome = fuzz_inputs.run_case("yaml", 0, 0, tmp_path, watch, timeout=10, max_mb=1024)
    assert outcome["result"] == "exception" and outcome["finding"] == "KeyError: 'no such key'"


def test_the_fuzzer_reports_a_read_outside_the_input(tmp_path: Path, monkeypatch) -> None:
    import tools.fuzz_inputs as fuzz_inputs

    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    watch = fuzz_inputs._Watch(tmp_path)
    monkeypatch.setattr("tools.fuzz_cases.read_case", lambda target, path, out: secret.read_text())
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


def test_a_bin_pickle_naming_a_far_memo_slot_is_refused_before_unpickling(tmp_path: Path) -> None:
    """Found by the fuzzer: `LONG_BINPUT 1562862965` in a 3 KB .bin made C's unpickler allocate
    12 GB for its memo (the worker was OOM-killed)."""
    path = tmp_path / "lfw.bin"
    path.write_bytes(b"\x80\x02]r\x75\xa5\x27\x5d." + bytes(64))
    with pytest.raises(FacetrainError, match=r"memo slot 1562879349, beyond any its 73 bytes could fill"):
        load_insightface_bin(path, None, False)


def test_a_zip_claiming_several_disks_is_one_line(tmp_path: Path) -> None:
    """Found by the fuzzer: zipfile.is_zipfile raised BadZipFile, which it does not catch."""
    path = tmp_path / "backbone.pth"
    end_of_directory = b"PK\x05\x06" + (1).to_bytes(2, "little") + bytes(16)  # disk number 1
    path.write_bytes(b"PK\x03\x04" + bytes(40) + end_of_directory)
    with pytest.raises(
        FacetrainError, match=r"not a readable (torch.save archive|PyTorch weights file) \("
    ) as error:
        read_backbone_state(path)
    # low item of #38: torch's reason was cut at 200 characters mid-word ("your checkpoint file is co")
    assert "This is an internal miniz error.);" in str(error.value) and "is co)" not in str(error.value)


def test_a_recordio_header_promising_no_images_is_one_line(tmp_path: Path) -> None:
    """Found by the fuzzer: record 0's range [1, 3) left no image keys, then keys[0] was an IndexError."""
    writer = RecordIOWriter(tmp_path / "train.rec", tmp_path / "train.idx")
    writer.write(0, pack_image_record([1, 3], b""))
    writer.write(1, pack_image_record([0, 0], b""))
    writer.close()
    with pytest.raises(
        FacetrainError, match=r"record 0: its label \[1.0, 3.0\] is not the \[first, end\) identity range"
    ):
        scan_recordio(tmp_path / "train.rec", progress=False)


@pytest.mark.parametrize("name", ["Ab\x00el", "A" * 300])
def test_pair_images_the_system_cannot_look_up_are_missing(tmp_path: Path, name: str) -> None:
    """Found by the fuzzer: a NUL byte (ValueError) or a 300-byte name (ENAMETOOLONG) in a pairs file."""
    lfw, csv_file = tmp_path / "pairs.txt", tmp_path / "pairs.csv"
    lfw.write_text(f"{name} 1 2\n")
    csv_file.write_text(f"{name}.png,b.png,1\n")
    for load, path in ((load_lfw_pairs, lfw), (load_csv_pairs, csv_file)):
        with pytest.raises(FacetrainError, match="none of the 1 pairs has both of its images"):
            load(path, None, True)


def test_values_from_a_file_are_cut_in_messages(tmp_path: Path) -> None:
    """Found by the fuzzer: 5000 characters of a file's value echoed into one message."""
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("a.png,b.png," + "1" * 5000 + "\n")
    with pytest.raises(FacetrainError) as error:
        load_csv_pairs(pairs, None, True)
    assert len(str(error.value)) < 300


def test_a_config_number_beyond_float_range_is_one_line(tmp_path: Path) -> None:
    """Found by the fuzzer: math.isfinite(10**400) raised OverflowError in validation."""
    config = tmp_path / "big.yaml"
    config.write_text("optim:\n  lr: " + "1" * 400 + "\n")
    with pytest.raises(FacetrainError, match="optim.lr"):
        validate(load_config(config), 1)


def test_a_list_file_of_blank_lines_is_one_line(tmp_path: Path) -> None:
    """Found by the fuzzer: pandas' EmptyDataError for a file of whitespace after a line."""
    path = tmp_path / "list.csv"
    path.write_text("\n \n\t\n")
    with pytest.raises(FacetrainError, match="list file .* (is empty|lists no images)"):
        read_list_file(path)


def test_a_validation_message_cuts_a_3000_digit_value(tmp_path: Path) -> None:
    """Found by the fuzzer: train.steps of 3000 digits was echoed whole by validation."""
    config = tmp_path / "steps.yaml"
    config.write_text("train:\n  steps: 3" + "1" * 3000 + "\n")
    with pytest.raises(FacetrainError) as error:
        validate(load_config(config), 1)
    assert "train.steps = 31111" in str(error.value) and len(str(error.value)) < 400


def test_a_refused_global_with_a_long_name_is_cut(tmp_path: Path) -> None:
    """Found by the fuzzer: the name of a refused global, 5000 characters, was echoed whole."""
    path = tmp_path / "lfw.bin"
    path.write_bytes(b"\x80\x02c_codecs" + b"1" * 5000 + b"\nencode\n.")
    with pytest.raises(FacetrainError, match="refused to load: the pickle asks for _codecs111") as error:
        load_insightface_bin(path, None, False)
    assert len(str(error.value)) < 400


def test_a_margin_state_of_another_shape_is_one_line(tmp_path: Path) -> None:
    """Found by the fuzzer (#57): a checkpoint whose margin state (0-dim running values) has another
    shape was a size-mismatch RuntimeError from torch's load_state_dict in the middle of a resume."""
    case = tmp_path / "case.json"
    case.write_text(
        '{"margin": "elasticface_cos", "mutations": [{"value": 5.0, "shape": [2], "dtype": "int64", "pick": 3}]}'
    )
    with pytest.raises(
        FacetrainError,
        match=r"its head.margin_state.step has shape \[2\], where this run's margin keeps \[\]",
    ):
        read_case("margin", case, tmp_path)


@pytest.mark.parametrize(
    "index",
    [
        b"\x80\x04\x8c\x02\xff\xfe\x94.",
        b"\x80\x02X\x01\x00\x00\x00aK\x01\x85R.",
        b"\x80\x02]r\x75\xa5\x27\x5d.",
    ],
)
def test_a_damaged_checkpoint_index_is_one_line(tmp_path: Path, index: bytes) -> None:
    """Found by the fuzzer (#57, through loss.teacher): a mutated .metadata made the unpickler raise
    UnicodeDecodeError or TypeError (tracebacks); a far memo slot would have allocated gigabytes."""
    from facetrain.checkpoint.storage import read_index

    (tmp_path / ".metadata").write_bytes(index)
    with pytest.raises(
        FacetrainError, match=rf"^refusing checkpoint index {tmp_path / '.metadata'}: "
    ) as error:
        read_index(tmp_path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("label", ["0" + "1" * 5000, "99999999999999999999"])
def test_a_list_label_of_many_digits_is_cut_or_refused(tmp_path: Path, label: str) -> None:
    """Found by the fuzzer (#57): a 5001-digit label was echoed whole (5107 characters); 10**20 read as
    a float and wrapped to a negative int64 label without a word."""
    (tmp_path / "a.png").write_bytes(b"")
    path = tmp_path / "list.csv"
    path.write_text(f"path,label\na.png,{label}\n")
    with pytest.raises(
        FacetrainError, match=r"line 2: label '\d+' is not an integer \(of at most 15 digits\)$"
    ):
        read_list_file(path)


def test_a_name_with_a_newline_stays_one_line_in_a_message(tmp_path: Path) -> None:
    """Found by the fuzzer (#57): an identity folder named "a<newline>b" broke pack's message (and any
    message naming a file) over two lines; control characters are written escaped."""
    from facetrain.data.pack import pack_folder

    (tmp_path / "faces" / "a\nb").mkdir(parents=True)
    (tmp_path / "faces" / "a\nb" / "0.png").write_bytes(b"not an image")
    with pytest.raises(FacetrainError) as error:
        pack_folder(tmp_path / "faces", tmp_path / "out" / "train.rec")
    assert str(error.value) == f"image {tmp_path}/faces/a\\nb/0.png is corrupt or not an image"


def test_a_zip_of_a_version_zipfile_cannot_read_is_one_line(tmp_path: Path) -> None:
    """Found by the fuzzer (#57's long run): a central directory asking for zip version 25.5 was
    zipfile's NotImplementedError traceback."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    data = bytearray(buffer.getvalue())
    central = data.rfind(b"PK\x01\x02")
    data[central + 6 : central + 8] = (255).to_bytes(2, "little")  # version needed to extract: 25.5
    path = tmp_path / "backbone.pth"
    path.write_bytes(bytes(data))
    with pytest.raises(FacetrainError, match=r"not a readable torch.save archive \(zip file version 25.5\)"):
        read_backbone_state(path)


def test_a_timm_name_of_thousands_of_characters_is_cut() -> None:
    """Found by the fuzzer (#57): `timm:` and 5000 letters was echoed whole by the unknown-model line."""
    with pytest.raises(FacetrainError, match="timm has no model 'aaaa") as error:
        validate(load_config(None, ["model.backbone=timm:" + "a" * 5000]), 1)
    assert len(str(error.value)) < 500


def test_a_teacher_holding_nan_is_one_line(tmp_path: Path) -> None:
    """Found by the fuzzer (#57): a teacher checkpoint whose weights hold NaN was loaded, and every
    step's distillation term was NaN (blamed on the learning rate)."""
    import torch

    from facetrain.checkpoint.names import BACKBONE
    from facetrain.interop.insightface_import import write_imported_checkpoint
    from facetrain.models import build_backbone
    from facetrain.train.distillation import build_distillation
    from facetrain.train.run_config import Config

    config = Config()
    config.model.backbone, config.model.embedding_size, config.data.image_size = "small", 16, [32, 32]
    entries = {
        BACKBONE + k: v for k, v in build_backbone(config.model, image_size=(32, 32)).state_dict().items()
    }
    first = next(key for key, value in entries.items() if value.is_floating_point())
    entries[first] = torch.full_like(entries[first], float("nan"))
    write_imported_checkpoint(entries, {"embedding_size": 16}, config, [], tmp_path / "teacher")
    config.loss.teacher = str(tmp_path / "teacher")
    with pytest.raises(
        FacetrainError, match=rf"^loss.teacher: {tmp_path / 'teacher'}: '.+' holds \d+ NaN or infinite values"
    ):
        build_distillation(config.loss, 16, torch.device("cpu"))
