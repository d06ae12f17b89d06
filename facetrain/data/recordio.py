"""insightface/mxnet RecordIO (`train.rec` + `train.idx`), read and written without mxnet.

Layout, as dmlc-core writes it: each record is `magic, lrecord, data, zero padding to 4 bytes`, where
`lrecord` keeps the length in its lower 29 bits and a continuation flag in the upper 3 (0 whole, 1 first,
2 middle, 3 last part). A payload containing the magic word at a 4-byte aligned offset is split there
and the magic itself is dropped; the reader puts it back. The payload starts with the image header
`<IfQQ` (flag, label, id, id2); flag > 0 means `flag` float32 labels follow the header. The `.idx` file
is text, `key<TAB>byte offset` per line.

insightface face sets add bookkeeping records: record 0's label is `[first, end)` of the identity
records, so images are records `1 .. first-1`, and each identity record's label is the `[a, b)` range
of its images. Sets without that header simply list every image in the index. Beside `train.rec`
insightface keeps a `property` file, `classes,height,width` (`85742,112,112` for MS1MV2); when it is
there, it is checked against the identities the index holds and the size of the first image, since a
property file copied from another set would have insightface build a head of the wrong size.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facetrain.data.dataset import SampleTable
from facetrain.data.decode import BadImageError, decode_image
from facetrain.data.folder import scan_image_folder
from facetrain.data.source_record import DataSource, register_source
from facetrain.errors import FacetrainError
from facetrain.input_files import read_regular_bytes
from facetrain.progress import ProgressBar

MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_LENGTH_BITS = 29
_LENGTH_MASK = (1 << _LENGTH_BITS) - 1
MAX_RECORD_BYTES = _LENGTH_MASK  # the largest payload a record part can hold
_RECORD_HEADER = struct.Struct("<II")
IMAGE_HEADER = struct.Struct("<IfQQ")
PROPERTY_NAME = "property"


@dataclass(frozen=True)
class ImageHeader:
    flag: int
    label: float | np.ndarray
    id: int
    id2: int

    @property
    def class_label(self) -> float:
        """The identity: the label itself, or its first entry when a label vector is stored."""
        return float(self.label[0]) if isinstance(self.label, np.ndarray) else float(self.label)


def pack_image_record(
    label: float | Sequence[float], payload: bytes, record_id: int = 0, id2: int = 0
) -> bytes:
    """Header + payload as mxnet's `recordio.pack` builds it."""
    if isinstance(label, (int, float, np.integer, np.floating)):
        return IMAGE_HEADER.pack(0, float(label), record_id, id2) + payload
    vector = np.asarray(label, dtype="<f4")
    return IMAGE_HEADER.pack(vector.size, 0.0, record_id, id2) + vector.tobytes() + payload


def unpack_image_record(record: bytes, where: str = "record") -> tuple[ImageHeader, bytes]:
    if len(record) < IMAGE_HEADER.size:
        raise FacetrainError(
            f"{where} is shorter than its {IMAGE_HEADER.size}-byte header; the file is damaged"
        )
    flag, label, record_id, id2 = IMAGE_HEADER.unpack_from(record)
    body = record[IMAGE_HEADER.size :]
    if flag > 0:
        if len(body) < 4 * flag:
            raise FacetrainError(f"{where} announces {flag} labels but is too short; the file is damaged")
        vector = np.frombuffer(body, dtype="<f4", count=flag).astype(np.float32)
        return ImageHeader(flag, vector, record_id, id2), body[4 * flag :]
    return ImageHeader(flag, label, record_id, id2), body


def _aligned(length: int) -> int:
    return (length + 3) & ~3


INDEX_NUMBER = re.compile(r"[0-9]{1,18}")  # ASCII digits; a 5000-digit key would fill its message


INDEX_LINE_BYTES = 38  # key<TAB>offset\n, each of at most 18 digits
PROPERTY_BYTES = 4096  # "classes,height,width" with room for spaces and a comment


def read_index(idx_path: Path, records_at_most: int | None = None) -> dict[int, int]:
    """`key -> byte offset`, in file order. With `records_at_most` (what the .rec can hold), an index
    longer than that many lines could be is refused by its size before it is read: a 2 GB sparse .idx
    was read whole (27-31 s, 4.9 GB) before its first bad line was found."""
    limit = (1 << 62) if records_at_most is None else INDEX_LINE_BYTES * (records_at_most + 1)
    data = read_regular_bytes(idx_path, "RecordIO index", limit)  # a FIFO, a folder, too big: one line
    try:
        lines = data.decode("ascii").splitlines()
    except UnicodeDecodeError as error:
        raise FacetrainError(
            f"RecordIO index {idx_path}: byte {error.start} is not text; an index holds lines of key<TAB>offset"
        ) from None
    offsets: dict[int, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not all(INDEX_NUMBER.fullmatch(field.strip()) for field in fields):
            raise FacetrainError(
                f"RecordIO index {idx_path} line {number}: expected 'key<TAB>offset', two whole numbers below 10**18"
            )
        offsets[int(fields[0])] = int(fields[1])
    return offsets


class RecordIOFile:
    """Random access to records by key; each process opens its own descriptor on first use."""

    def __init__(self, rec_path: str | Path, idx_path: str | Path | None = None):
        # set first: `__del__` runs even when the checks below reject the files
        self._fd: int | None = None
        self._pid: int | None = None
        self.rec_path = Path(rec_path)
        self.idx_path = Path(idx_path) if idx_path is not None else self.rec_path.with_suffix(".idx")
        if not self.rec_path.is_file():
            raise FacetrainError(f"RecordIO file {self.rec_path} does not exist")
        if not self.idx_path.is_file():
            raise FacetrainError(
                f"RecordIO index {self.idx_path} does not exist; it must sit beside {self.rec_path.name}"
            )
        self.size = self.rec_path.stat().st_size
        # each record takes at least its 8-byte header in the .rec
        self.offsets = read_index(self.idx_path, records_at_most=self.size // _RECORD_HEADER.size)
        self._check_offsets()

    def _check_offsets(self) -> None:
        for number, (key, offset) in enumerate(self.offsets.items(), start=1):
            if not 0 <= offset <= self.size - _RECORD_HEADER.size:
                raise FacetrainError(
                    f"RecordIO index {self.idx_path} line {number}: record {key} at byte {offset} lies past "
                    f"the end of {self.rec_path} ({self.size} bytes); the .rec is truncated or the .idx is stale"
                )
        if self.offsets:
            last_key = max(self.offsets, key=self.offsets.__getitem__)
            self.read(last_key)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_fd"] = None
        state["_pid"] = None
        return state

    def __del__(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)

    def _descriptor(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            self._fd = os.open(self.rec_path, os.O_RDONLY)
            self._pid = os.getpid()
        return self._fd

    def keys(self) -> list[int]:
        return list(self.offsets)

    def _read_exact(self, length: int, offset: int, key: int) -> bytes:
        data = os.pread(self._descriptor(), length, offset)
        if len(data) != length:
            raise FacetrainError(
                f"RecordIO file {self.rec_path} record {key} is truncated at byte {offset + len(data)}"
            )
        return data

    def read(self, key: int, limit: int | None = None) -> bytes:
        """The payload of record `key`; with `limit`, at least its first `limit` bytes (cheaper for headers)."""
        if key not in self.offsets:
            raise FacetrainError(f"RecordIO index {self.idx_path} has no record {key}")
        offset = self.offsets[key]
        parts: list[bytes] = []
        gathered = 0
        while True:
            magic, lrecord = _RECORD_HEADER.unpack(self._read_exact(_RECORD_HEADER.size, offset, key))
            if magic != MAGIC:
                raise FacetrainError(
                    f"RecordIO file {self.rec_path} record {key}: no record starts at byte {offset}; "
                    "the .idx does not belong to this .rec"
                )
            continuation, length = lrecord >> _LENGTH_BITS, lrecord & _LENGTH_MASK
            wanted = length if limit is None else min(length, max(limit - gathered, 0))
            parts.append(self._read_exact(wanted, offset + _RECORD_HEADER.size, key))
            gathered += length
            if continuation in (0, 3) or (limit is not None and gathered >= limit):
                return b"".join(parts)
            parts.append(_MAGIC_BYTES)
            gathered += len(_MAGIC_BYTES)
            offset += _RECORD_HEADER.size + _aligned(length)

    def read_image_record(self, key: int) -> tuple[ImageHeader, bytes]:
        return unpack_image_record(self.read(key), where=f"RecordIO file {self.rec_path} record {key}")

    def read_header(self, key: int) -> ImageHeader:
        head = self.read(key, limit=IMAGE_HEADER.size + 4 * 16)
        flag = IMAGE_HEADER.unpack_from(head)[0] if len(head) >= 4 else 0
        if flag > 16:
            head = self.read(key)
        return unpack_image_record(head, where=f"RecordIO file {self.rec_path} record {key}")[0]


class RecordIOWriter:
    """Writes `.rec` and `.idx` to temporary names and moves both into place on `close`; an OSError
    (a full disk, a file-size limit) removes both and names the file being written, which a failed
    `write()` does not."""

    def __init__(self, rec_path: str | Path, idx_path: str | Path):
        self.rec_path, self.idx_path = Path(rec_path), Path(idx_path)
        self._rec_tmp = self.rec_path.with_name(f".{self.rec_path.name}.tmp-{os.getpid()}")
        self._idx_tmp = self.idx_path.with_name(f".{self.idx_path.name}.tmp-{os.getpid()}")
        self._index_lines: list[str] = []
        with self._naming(self.rec_path):
            self._rec = open(self._rec_tmp, "wb")

    @contextmanager
    def _naming(self, path: Path) -> Iterator[None]:
        try:
            yield
        except OSError as error:
            self.abort()
            if error.filename is not None and error.filename not in (str(self._rec_tmp), str(self._idx_tmp)):
                raise
            raise OSError(error.errno, error.strerror, str(path)) from None

    def write(self, key: int, payload: bytes) -> None:
        self._index_lines.append(f"{key}\t{self._rec.tell()}\n")
        aligned_end = len(payload) & ~3
        words = np.frombuffer(payload, dtype="<u4", count=aligned_end // 4)
        splits = (np.flatnonzero(words == MAGIC) * 4).tolist()
        start = 0
        with self._naming(self.rec_path):
            for split in splits:
                self._write_part(1 if start == 0 else 2, payload[start:split])
                start = split + 4
            self._write_part(3 if splits else 0, payload[start:])
            padding = _aligned(len(payload)) - len(payload)
            self._rec.write(b"\0" * padding)

    def _write_part(self, continuation: int, part: bytes) -> None:
        if len(part) > _LENGTH_MASK:
            raise FacetrainError(f"a record of {len(part)} bytes is too large for RecordIO (limit 2^29)")
        self._rec.write(_RECORD_HEADER.pack(MAGIC, (continuation << _LENGTH_BITS) | len(part)))
        self._rec.write(part)

    def close(self, before_moving: Callable[[], None] | None = None) -> None:
        """Flush both files, call `before_moving` (what must succeed before they replace earlier ones),
        then move both into place."""
        with self._naming(self.rec_path):
            self._rec.flush()
            os.fsync(self._rec.fileno())
            self._rec.close()
        with self._naming(self.idx_path):
            with open(self._idx_tmp, "w") as index:
                index.write("".join(self._index_lines))
                index.flush()
                os.fsync(index.fileno())
        try:
            if before_moving is not None:
                before_moving()
        except BaseException:
            self.abort()
            raise
        os.replace(self._rec_tmp, self.rec_path)
        os.replace(self._idx_tmp, self.idx_path)

    def abort(self) -> None:
        with suppress(OSError):  # a full disk may refuse the buffered bytes' flush
            self._rec.close()
        for tmp in (self._rec_tmp, self._idx_tmp):
            tmp.unlink(missing_ok=True)


def write_recordio(
    image_folder: str | Path, out_prefix: str | Path, overwrite: bool = False, progress: bool = True
) -> tuple[Path, Path]:
    """`out_prefix.rec/.idx` from `root/<identity>/<image>`, with insightface's header and identity records.

    Image files are stored as they are (no re-encoding), so the reader returns the same bytes.
    """
    table = scan_image_folder(image_folder)
    rec_path, idx_path = Path(f"{out_prefix}.rec"), Path(f"{out_prefix}.idx")
    for path in (rec_path, idx_path):
        if path.exists() and not overwrite:
            raise FacetrainError(f"{path} already exists; pass overwrite (--overwrite) to replace it")
    rec_path.parent.mkdir(parents=True, exist_ok=True)
    write_table_recordio(table, rec_path, idx_path, progress)
    return rec_path, idx_path


def write_table_recordio(
    table: SampleTable,
    rec_path: Path,
    idx_path: Path,
    progress: bool = True,
    check_image: Callable[[int, bytes], None] | None = None,
    before_moving: Callable[[], None] | None = None,
) -> None:
    """The records of `table` (labels sorted, as a folder scan gives them), moved into place only when
    all are written and `before_moving()` has succeeded; `check_image(index, bytes)` may refuse an
    image, which leaves nothing behind."""
    count = len(table.labels)
    first_identity_record = count + 1
    writer = RecordIOWriter(rec_path, idx_path)
    try:
        writer.write(
            0, pack_image_record([first_identity_record, first_identity_record + len(table.class_names)], b"")
        )
        for index in ProgressBar(range(count), desc="writing records", unit="img", disable=not progress):
            key = index + 1
            image = table.reader.read(index)
            if check_image is not None:
                check_image(index, image)
            writer.write(key, pack_image_record(float(table.labels[index]), image, key))
        starts = np.searchsorted(table.labels, np.arange(len(table.class_names) + 1)) + 1
        for label in range(len(table.class_names)):
            key = first_identity_record + label
            writer.write(key, pack_image_record([starts[label], starts[label + 1]], b"", key))
    except BaseException:
        writer.abort()
        raise
    writer.close(before_moving)


class RecordImageReader:
    """The `EncodedImageReader` of a RecordIO set: sample i is record `keys[i]`, header stripped."""

    def __init__(self, records: RecordIOFile, keys: list[int]):
        self.records = records
        self.keys = keys

    def __len__(self) -> int:
        return len(self.keys)

    def read(self, index: int) -> bytes:
        """A damaged record is a bad image, so `data.skip_bad_images` can skip it like a corrupt file."""
        try:
            return self.records.read_image_record(self.keys[index])[1]
        except BadImageError:
            raise
        except FacetrainError as error:
            raise BadImageError(str(error)) from None

    def name(self, index: int) -> str:
        return f"{self.records.rec_path} record {self.keys[index]}"


def _labels_from_identity_records(
    records: RecordIOFile, first: int, end: int, image_count: int
) -> np.ndarray | None:
    """Per-image labels from the identity ranges (one header read per identity), or None if they do not tile."""
    labels = np.full(image_count, -1, dtype=np.int64)
    for key in range(first, end):
        if key not in records.offsets:
            return None
        bounds = records.read_header(key).label
        if not isinstance(bounds, np.ndarray) or bounds.size < 2:
            return None
        start, stop = int(bounds[0]), int(bounds[1])
        if not 1 <= start <= stop <= image_count + 1 or start == stop:
            return None
        labels[start - 1 : stop - 1] = int(records.read_header(start).class_label)
    return None if (labels < 0).any() else labels


def _identity_range(header: ImageHeader, records: RecordIOFile) -> tuple[int, int]:
    """Record 0's `[first, end)` of the identity records, the insightface marker of a face set."""
    bounds = np.atleast_1d(header.label)
    first, end = (int(bounds[0]), int(bounds[1])) if bounds.size >= 2 else (0, 0)
    records_held = len(records.offsets)  # a range past them would be a list of 10**18 keys
    if not 2 <= first <= end or first - 1 > records_held or end - first > records_held:
        raise FacetrainError(
            f"RecordIO file {records.rec_path} record 0: its label {bounds.tolist()} is not the "
            "[first, end) identity range of an insightface set"
        )
    return first, end


def scan_recordio(rec_path: str | Path, progress: bool = True) -> SampleTable:
    """Labels are remapped to 0..C-1 in the order of the stored numeric labels.

    `rec_path` may also be the dataset folder, as insightface ships them (`faces_emore/train.rec`).
    """
    if Path(rec_path).is_dir():
        rec_path = Path(rec_path) / "train.rec"
    records = RecordIOFile(rec_path)
    if not records.offsets:
        raise FacetrainError(f"RecordIO index {records.idx_path} is empty; rebuild it with the .rec")
    header = records.read_header(0) if 0 in records.offsets else None
    labels = None
    if header is not None and header.flag > 0:
        first, end = _identity_range(header, records)
        keys = list(range(1, first))
        missing = [key for key in keys if key not in records.offsets]
        if missing:
            raise FacetrainError(
                f"RecordIO index {records.idx_path} lacks record {missing[0]}, which record 0's range promises"
            )
        labels = _labels_from_identity_records(records, first, end, len(keys))
    else:
        keys = records.keys()
    if labels is None:
        labels = np.asarray(
            [
                records.read_header(key).class_label
                for key in ProgressBar(
                    keys, desc="reading labels", unit="rec", disable=not progress or len(keys) < 10000
                )
            ],
            dtype=np.float64,
        ).astype(np.int64)
    original, dense = np.unique(labels, return_inverse=True)
    check_property(records, len(original), keys[0])
    return SampleTable(
        RecordImageReader(records, keys), dense, [str(value) for value in original], description=str(rec_path)
    )


def read_property(rec_path: Path) -> tuple[int, int, int] | None:
    """insightface's `property` beside the .rec as (classes, height, width), or None when there is none."""
    path = rec_path.parent / PROPERTY_NAME
    if not path.is_file():
        return None
    try:  # bounded: a sparse property of 2 GB was read whole before it was refused
        text = read_regular_bytes(path, "property file", PROPERTY_BYTES).decode().strip()
    except UnicodeDecodeError as error:
        raise FacetrainError(f"cannot read {path}: {error}; fix it or remove it") from None
    fields = [field.strip() for field in text.split(",")]
    if len(fields) != 3 or not all(field.isdigit() and int(field) > 0 for field in fields):
        raise FacetrainError(
            f"{path}: expected insightface's 'classes,height,width' (e.g. 85742,112,112), found {text[:40]!r}; "
            "fix it or remove it"
        )
    classes, height, width = (int(field) for field in fields)
    return classes, height, width


def check_property(records: RecordIOFile, class_count: int, first_key: int) -> None:
    """One line when the property file disagrees with the set: its class count, or its image size."""
    found = read_property(records.rec_path)
    if found is None:
        return
    classes, height, width = found
    path = records.rec_path.parent / PROPERTY_NAME
    if classes != class_count:
        raise FacetrainError(
            f"{path} says {classes} classes, but {records.rec_path} holds {class_count} identities; the property "
            "file belongs to another set: fix it to match or remove it"
        )
    image = decode_image(records.read_image_record(first_key)[1], f"{records.rec_path} record {first_key}")
    if tuple(image.shape[:2]) != (height, width):
        raise FacetrainError(
            f"{path} says {height}x{width} images, but {records.rec_path} record {first_key} is "
            f"{image.shape[0]}x{image.shape[1]}; the property file belongs to another set: fix it to match or remove it"
        )


def is_recordio(path: Path) -> bool:
    """A `.rec` file, or a folder holding `train.rec` as insightface ships its sets."""
    if path.is_file():
        return path.suffix.lower() == ".rec"
    return (path / "train.rec").is_file()


register_source(
    "recordio",
    DataSource(
        scan_recordio,
        None,
        "insightface's train.rec (its .idx beside it) or their folder",
        recognise=is_recordio,
    ),
)
