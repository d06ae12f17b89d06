"""A mutation fuzzer for facetrain's importers and readers: each case is a small valid input, mutated.

    python tools/fuzz_inputs.py --cases 300 --seed 0 --out fuzz.json      # 300 cases per target
    python tools/fuzz_inputs.py --replay onnx:17 --seed 0 --keep case17   # one case again, kept

Targets: ONNX graphs (`import insightface`'s reader; mutated as a graph: shapes, types, raw data,
external data, attributes, wiring that loops), dlib `.dat`, `.pth` (torch.save zips, their entries
recompressed), a run folder's checkpoint files (`--resume auto`'s search), `.bin` verification pickles,
`.rec`/`.idx`, images, and the text readers (YAML configs, LFW and CSV pairs, IJB meta, list files),
mutated byte by byte and with hostile tokens (aliases, `..`, 1e309, 20-digit numbers, NUL, superscripts).

A finding is anything but success or one line of FacetrainError (a traceback's exception, a message
of several lines or over 1000 characters, a line a C library printed to stderr beside it), a case
over `--timeout` seconds, the worker's peak memory growing by more than `--max-memory-mb`, a crash of
the worker, or a file opened outside the case's input folder under the fuzzing folder (planted
`secret.txt` files beside and above it) or written outside its output folder, as an audit hook sees
them. The worker's address space is capped at ADDRESS_SPACE_GB, so an allocation of gigabytes is a
MemoryError there rather than the OOM killer's. Cases are reproducible: case N of a target is drawn
from `Random(f"{seed}:{target}:{N}")` (`tools/fuzz_cases.py` writes and reads them).

All cases run in one worker process that imports facetrain once; a crash restarts it at the next case.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools import fuzz_cases  # noqa: E402

ADDRESS_SPACE_GB = 6


# ---- the worker: runs cases in process, watching time, memory and file access ------------------


class _Watch:
    """An audit hook noting files opened under the fuzzing folder outside a case's input (reads) or
    output (writes); sys.addaudithook cannot be removed, so one watches every case in turn."""

    def __init__(self, root: Path):
        self.root = str(root)
        self.allowed_read = self.allowed_write = ""
        self.events: list[str] = []
        sys.addaudithook(self.hook)

    def hook(self, event: str, args: tuple) -> None:
        if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.path.abspath(os.fsdecode(args[0]))
        if not path.startswith(self.root + os.sep):
            return
        mode, flags = args[1], args[2]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
            flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        )
        allowed = self.allowed_write if writing else self.allowed_read
        if not (allowed and path.startswith(allowed + os.sep)) and not path.startswith(
            self.allowed_write + os.sep
        ):
            self.events.append(f"{'wrote' if writing else 'read'} {path}")


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_case(
    target: str, seed: int, number: int, work: Path, watch: _Watch, timeout: float, max_mb: float
) -> dict:
    """One case in process; its outcome and, when it is a finding, why."""
    from facetrain.errors import FacetrainError

    rng = random.Random(f"{seed}:{target}:{number}")
    case = work / "cases" / f"{target}_{number}"
    inputs, out = case / "input", case / "out"
    out.mkdir(parents=True)
    watch.allowed_read, watch.allowed_write = str(case), str(out)
    path = fuzz_cases.write_case(target, rng, inputs)
    watch.allowed_read, watch.events = str(inputs), []
    before, started = _peak_rss_mb(), time.monotonic()
    finding = None
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        fuzz_cases.read_case(target, path, out)
        result = "ok"
    except FacetrainError as error:
        result = "error"
        try:
            fuzz_cases.check_message(error)
        except AssertionError as bad:
            finding = str(bad)
    except _Timeout:
        result, finding = "timeout", f"over {timeout:g} s"
    except BaseException as error:  # noqa: BLE001 - any other exception is what the fuzzer looks for
        result = "exception"
        finding = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    seconds = time.monotonic() - started
    grown = _peak_rss_mb() - before
    if finding is None and grown > max_mb:
        finding = f"peak memory grew by {grown:.0f} MB"
    if finding is None and watch.events:
        finding = watch.events[0]
    return {
        "target": target,
        "case": number,
        "result": result,
        "seconds": round(seconds, 3),
        "finding": finding,
    }


class _Timeout(Exception):
    pass


def _alarm(_signum, _frame) -> None:
    raise _Timeout


def serve(work: Path, seed: int, timeout: float, max_mb: float) -> None:
    """Worker: read `target number` lines, answer one JSON line each."""
    import resource
    import warnings

    # address space, not memory: a case that allocates gigabytes fails here (MemoryError, a finding)
    # instead of bringing the machine's OOM killer; torch and onnx import within it
    limit = ADDRESS_SPACE_GB << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    warnings.simplefilter("ignore")
    os.environ.setdefault("FACETRAIN_QUIET", "1")
    signal.signal(signal.SIGALRM, _alarm)
    fuzz_cases.import_readers()
    watch = _Watch(work)
    for line in sys.stdin:
        target, number = line.split()
        outcome = run_case(target, seed, int(number), work, watch, timeout, max_mb)
        print(json.dumps(outcome), flush=True)


def fuzz(cases: int | dict[str, int], seed: int, targets: tuple[str, ...] = fuzz_cases.TARGETS,
         timeout: float = 10.0, max_mb: float = 1024.0, work: Path | None = None,
         log: Path | None = None) -> dict:  # fmt: skip
    """Run `cases` cases of each target (or, given as {target: count}, that many of those targets) in
    one worker; the summary with counts and findings. `log`: each outcome appended there as a JSON
    line as it comes, so a run stopped by a time limit keeps what it did."""
    counts = cases if isinstance(cases, dict) else dict.fromkeys(targets, cases)
    targets = tuple(counts)
    own = tempfile.TemporaryDirectory(prefix="facetrain-fuzz-") if work is None else None
    work = Path(own.name if own else work)
    for secret in (work / "secret.txt", work / "cases" / "secret.txt"):
        fuzz_cases.write_file(secret, b"TOPSECRET")
    started = time.monotonic()
    outcomes, worker = [], None
    try:
        for target in targets:
            for number in range(counts[target]):
                if worker is None:
                    worker = _start_worker(work, seed, timeout, max_mb)
                outcome = _ask(worker, target, number, timeout * 3 + 30)
                if outcome is None:  # the worker died or hung past its own alarm
                    worker.kill()
                    worker.wait()
                    worker = None
                    outcome = {"target": target, "case": number, "result": "crash", "seconds": None,
                               "finding": "the worker crashed or hung"}  # fmt: skip
                printed = _drain(worker) if worker is not None else ""
                if printed and not outcome["finding"]:  # a C library's own line beside facetrain's
                    outcome["finding"] = f"printed to stderr: {printed.strip().splitlines()[0][:200]}"
                outcomes.append(outcome)
                if log is not None:
                    with log.open("a") as handle:
                        handle.write(json.dumps(outcome) + "\n")
    finally:
        if worker is not None:
            worker.stdin.close()
            worker.wait()
        if own:
            own.cleanup()
    findings = [outcome for outcome in outcomes if outcome["finding"]]
    per_target = {
        target: {
            result: sum(1 for o in outcomes if o["target"] == target and o["result"] == result)
            for result in ("ok", "error", "exception", "timeout", "crash")
        }
        for target in targets
    }
    return {"cases": len(outcomes), "seed": seed, "seconds": round(time.monotonic() - started, 1),
            "per_target": per_target, "findings": findings}  # fmt: skip


def _start_worker(work: Path, seed: int, timeout: float, max_mb: float) -> subprocess.Popen:
    command = [sys.executable, __file__, "--serve", str(work), "--seed", str(seed), "--timeout", str(timeout),
               "--max-memory-mb", str(max_mb)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def _drain(worker: subprocess.Popen) -> str:
    """What the worker wrote to stderr since the last call (C libraries write there directly)."""
    chunks = []
    while select.select([worker.stderr], [], [], 0)[0]:  # written before the answer was
        chunk = os.read(worker.stderr.fileno(), 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _ask(worker: subprocess.Popen, target: str, number: int, limit: float) -> dict | None:
    try:
        worker.stdin.write(f"{target} {number}\n")
        worker.stdin.flush()
    except BrokenPipeError:
        return None
    ready, _, _ = select.select([worker.stdout], [], [], limit)
    line = worker.stdout.readline() if ready else ""
    return json.loads(line) if line else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=300, help="cases per target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", action="append", choices=fuzz_cases.TARGETS, help="only these targets")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a case may take")
    parser.add_argument("--max-memory-mb", type=float, default=1024.0)
    parser.add_argument("--out", type=Path, help="write the summary as JSON here")
    parser.add_argument("--log", type=Path, help="append each case's outcome here as a JSON line")
    parser.add_argument("--replay", help="TARGET:N: write case N's input to --keep and run it here")
    parser.add_argument("--keep", type=Path, default=Path("fuzz_case"))
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.seed, args.timeout, args.max_memory_mb)
        return
    if args.replay:
        target, number = args.replay.split(":")
        signal.signal(signal.SIGALRM, _alarm)
        fuzz_cases.import_readers()
        outcome = run_case(target, args.seed, int(number), args.keep, _Watch(args.keep.resolve()), args.timeout,
                           args.max_memory_mb)  # fmt: skip
        print(json.dumps(outcome))
        return
    summary = fuzz(
        args.cases,
        args.seed,
        tuple(args.target or fuzz_cases.TARGETS),
        args.timeout,
        args.max_memory_mb,
        log=args.log,
    )
    text = json.dumps(summary, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text if summary["findings"] else f"{summary['cases']} cases, no findings, {summary['seconds']} s")
    sys.exit(1 if summary["findings"] else 0)


if __name__ == "__main__":
    main()
