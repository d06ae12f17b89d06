"""The GPU check: `pytest -m cuda` and the CUDA benchmarks, in two parts of under 6 minutes each; and
issue 56's figures side by side, in two more (parts 3 and 4).

Run through tools/gpu_check.sh OUT_DIR on a machine with CUDA (docs/gpu.md). Every step runs in its
own process with its own time limit, and the whole check stops starting steps when its budget is
spent, so one hang costs one step, never the report. `--dry-run` prints the plan (number, part, name,
command, tab-separated, a line a step) without running anything; tests/test_bench_device.py parses
every printed facetrain command against the CLI, so the plan cannot name an option that does not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 24 * 60
PART_BUDGET_S = 330  # one part in one 6-minute command, with room for its start
# insightface's files and the peers' wheels: ../shared/peers here, a carried copy (.peers) on a machine
# that only gets the checkout (docs/gpu.md); FACETRAIN_PEERS_DIR names another
PEERS_DIR = Path(
    os.environ.get(
        "FACETRAIN_PEERS_DIR",
        REPO / ".peers" if (REPO / ".peers").is_dir() else REPO.parent / "shared" / "peers",
    )
)
DRY_RUN_GPUS, DRY_RUN_GIB = 1, 80.0


@dataclass
class Step:
    name: str
    argv: list[str]  # starting with "facetrain" or "pytest"
    timeout_s: int
    skip_reason: str = ""
    report: str = ""  # the JSON file the step writes, relative to OUT
    table: str = ""  # its markdown table, copied into gpu_check.md
    part: int = 1
    result: dict = field(default_factory=dict)

    def command(self) -> list[str]:
        tool = {
            "facetrain": [sys.executable, "-m", "facetrain"],
            "pytest": [sys.executable, "-m", "pytest"],
            "python": [sys.executable],
        }
        return tool[self.argv[0]] + self.argv[1:]


BESIDE_THE_PEERS = ("beside the peers", ["--peers", "insightface,liger,cce", "--peers-dir", str(PEERS_DIR)])
EACH_MARGIN = (
    "each margin on the untiled head and the Triton tiles",
    ["--margins", "arcface,cosface,adaface,magface,curricularface,elasticface_arc"],
)


def _head(
    out: Path, name: str, precision: str, heads: str, gib: float, timeout_s: int, compared=BESIDE_THE_PEERS,
    part: int = 1,
) -> Step:  # fmt: skip
    """The head bench at one size, C 1M, B 1024, D 512; `compared`: what it sets the heads beside (its
    title and options)."""
    title, options = compared
    return Step(
        f"head alone {precision}, C 1M, B 1024, D 512, {title}",
        ["facetrain", "bench", "head", "--device", "cuda", "--world-sizes", "1", "--batch", "1024",
         "--dim", "512", "--classes", "1000000", "--heads", heads, "--precision", precision, *options,
         "--steps", "5", "--warmup", "2", "--memory-limit-gb", f"{0.9 * gib:.0f}", "--out", str(out / name),
         "--overwrite"],
        timeout_s,
        report=f"{name}/bench_head.json",
        table=f"{name}/bench_head.md",
        part=part,
    )  # fmt: skip


def _train(
    out: Path, backbone: str, classes: int, heads: str, part: int, extra: tuple[str, ...] = (), timeout_s: int = 90,
    name: str = "",
) -> Step:  # fmt: skip
    """`bench train` of `backbone` at 112px, bf16, channels_last, B 256 on one GPU (its MFU included);
    `extra`: more options (--compile, --from-folder), named in the step's title."""
    name = name or f"train_{backbone}_{classes // 1000}k"
    more = f" ({' '.join(extra)})" if extra else ""
    return Step(
        f"train {backbone} 112px bf16 channels_last B 256, C {classes:,}: {heads}{more}",
        ["facetrain", "bench", "train", "--device", "cuda", "--world-size", "1", "--backbone", backbone,
         "--image-size", "112", "--batch", "256", "--precision", "bf16", "--channels-last",
         "--classes", str(classes), "--heads", heads, "--linear-classes", "1000",
         "--steps", "10", "--warmup", "3", *extra, "--out", str(out / name)],
        timeout_s,
        report=f"{name}/train.json",
        part=part,
    )  # fmt: skip


# Issue 56's rows (parts 3 and 4): the head beside its peers, the train step's MFU, the real train
# command from JPEGs on disk, and a compiled backbone; each part one command of under 6 minutes
JPEG_FOLDER = (
    "jpeg_faces",
    512,
    16,
)  # folder under OUT, identities, images each: 8,192 JPEGs, 32 steps an epoch
FOLDER_WORKERS = 12
BESIDE_INSIGHTFACE_AND_CCE = (
    "with and without the gradient filter, beside insightface's Partial FC and Cut Cross-Entropy with and "
    "without its filter",
    ["--peers", "insightface,cce", "--peers-dir", str(PEERS_DIR)],
)


def issue56_plan(out: Path, gib: float) -> list[Step]:
    folder, identities, per_identity = JPEG_FOLDER
    return [
        _head(out, "issue56_head", "bf16", "sharded,tiled_triton,tiled_triton_fp32_rows,tiled_triton_filter", gib, 150,
              BESIDE_INSIGHTFACE_AND_CCE, part=3),
        _train(out, "r50", 2_000_000, "sharded,tiled,linear", part=3, name="issue56_train_r50_2000k"),
        Step("pytest -m cuda: no host wait between logs", ["pytest", "-m", "cuda", "-q", "-rs", "-p",
             "no:cacheprovider", "tests/test_train_device.py", f"--junitxml={out / 'pytest_train_device.xml'}"],
             90, part=4),
        Step("a folder of synthetic JPEG faces", ["python", "tools/jpeg_faces.py", str(out / folder),
             "--identities", str(identities), "--images-per-identity", str(per_identity)], 60, part=4),
        _train(out, "r50", identities, "tiled", part=4, timeout_s=150, name="issue56_train_r50_from_folder",
               extra=("--from-folder", str(out / folder), "--workers", str(FOLDER_WORKERS), "--steps", "30",
                      "--warmup", "6")),
        _train(out, "r50", 1000, "linear", part=4, timeout_s=180, name="issue56_train_r50_compiled",
               extra=("--compile",)),
    ]  # fmt: skip


def plan(out: Path, gpus: int, gib: float) -> list[Step]:
    """The steps, most important first (the kernels' correctness, then the head's speed beside its peers
    and where its time goes), in two parts that each fit one command of the device tool (6
    minutes, `PART_BUDGET_S`); sized for one GPU of `gib` GiB (the capacity search fills 90 % of it)."""
    pytest = ["pytest", "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider"]
    return [
        # a fresh machine compiles every margin's Triton kernels first: over 150 s on an H200, 51 s after
        Step("pytest -m cuda: the head", [*pytest, "-k", "head or triton", f"--junitxml={out / 'pytest_head.xml'}"],
             270, part=1),
        _head(out, "head_bf16", "bf16", "sharded,tiled,tiled_triton,tiled_triton_bf16,sharded_softmax,"
              "tiled_triton_softmax", gib, 150),
        Step("profile: untiled, tiled and Triton-tiled bf16 head step, C 1M", ["python", "tools/head_profile.py", "--out",
             str(out / "head_profile.json")], 40, report="head_profile.json", part=1),
        _head(out, "head_margins", "bf16", "sharded,tiled_triton", gib, 90, EACH_MARGIN),
        _head(out, "head_fp32", "fp32", "sharded,tiled,tiled_triton,sharded_softmax,tiled_triton_softmax", gib, 110),
        _train(out, "r50", 2_000_000, "sharded,tiled,linear", part=1),
        Step("pytest -m cuda: the rest", [*pytest, "-k", "not (head or triton)",
             f"--junitxml={out / 'pytest_rest.xml'}"], 240, part=2),
        Step(
            "head capacity: largest C that fits",
            ["facetrain", "bench", "head", "--capacity", "--device", "cuda", "--world-sizes", "1",
             "--batch", "1024", "--dim", "512", "--classes", "1000000,4000000", "--heads", "tiled_bf16,tiled",
             "--largest", "tiled_bf16,tiled", "--memory-limit-gb", f"{0.9 * gib:.0f}",
             "--out", str(out / "head_capacity"), "--overwrite"],
            90,
            report="head_capacity/bench_head_capacity.json",
            part=2,
        ),
        _train(out, "r100", 2_000_000, "sharded,tiled,linear", part=2),
        Step(
            "loader 8 and 16 workers, folder and .rec",
            ["facetrain", "bench", "data", "--device", "cuda", "--images", "4096", "--repeats", "2",
             "--loader-workers", "8,16", "--loader-batch", "256", "--out", str(out / "data.json"), "--overwrite"],
            60,
            report="data.json",
            part=2,
        ),
        Step(
            "eval embedding throughput",
            ["facetrain", "bench", "eval", "--device", "cuda", "--batch-size", "256", "--batches", "8",
             "--quiet", "--out", str(out / "eval.json"), "--overwrite"],
            40,
            report="eval.json",
            part=2,
        ),
        Step(
            "bench pipeline, 2 stages",
            ["facetrain", "bench", "pipeline", "--device", "cuda", "--backbone", "r50", "--image-size", "112",
             "--batch-size", "128", "--microbatches", "4", "--split-sizes", "64,32", "--repeats", "2",
             "--out", str(out / "pipeline"), "--overwrite"],
            150,
            skip_reason="" if gpus >= 2 else "needs 2 GPUs: gloo cannot send CUDA tensors point to point and "
            "NCCL refuses two ranks on one GPU",
            report="pipeline/bench_pipeline.json",
            part=2,
        ),
        *issue56_plan(out, gib),
    ]  # fmt: skip


def gpu_description() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {}
    properties = torch.cuda.get_device_properties(0)
    return {
        "name": properties.name,
        "count": torch.cuda.device_count(),
        "memory_gib": properties.total_memory / 2**30,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def run_step(step: Step, out: Path, deadline: float) -> None:
    left = int(deadline - time.monotonic())
    if step.skip_reason or left < 10:
        step.result = {
            "status": "skipped",
            "reason": step.skip_reason or "the check's time budget is spent",
        }
        return
    limit = min(step.timeout_s, left)
    started = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        done = subprocess.run(
            step.command(), cwd=REPO, env=env, capture_output=True, text=True, timeout=limit, check=False
        )
        status, output, code = (
            ("ok" if done.returncode == 0 else "failed"),
            done.stdout + done.stderr,
            done.returncode,
        )
    except subprocess.TimeoutExpired as expired:
        output = (
            (expired.stdout or b"").decode(errors="replace")
            if isinstance(expired.stdout, bytes)
            else (expired.stdout or "")
        )
        status, code = f"timed out after {limit} s", None
    step.result = {
        "status": status,
        "returncode": code,
        "seconds": round(time.monotonic() - started, 1),
        "output_tail": output[-4000:],
    }
    report = out / step.report if step.report else None
    if report is not None and report.exists():
        step.result["report"] = json.loads(report.read_text())
    if step.table and (out / step.table).exists():
        step.result["table"] = (out / step.table).read_text()


def pytest_counts(xml: Path) -> dict:
    """Counts and the failing tests' names from one junit report ({} when the step wrote none)."""
    if not xml.exists():
        return {}
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed_tests"] = [
        case.get("name") for case in suite.iter("testcase") if case.find("failure") is not None
        or case.find("error") is not None
    ]  # fmt: skip
    return counts


def markdown(results: dict) -> str:
    gpu = results["gpu"]
    lines = [
        "# GPU check",
        "",
        f"{gpu.get('name', 'no GPU')} x{gpu.get('count', 0)}, {gpu.get('memory_gib', 0):.0f} GiB, "
        f"torch {gpu.get('torch', '?')}, CUDA {gpu.get('cuda', '?')}; {results['date']}; "
        f"{results['seconds']:.0f} s in all",
        "",
        *(f"{name}: {counts}" for name, counts in results["pytest"].items()),
        "",
        "| step | status | seconds |",
        "| --- | --- | ---: |",
    ]
    for step in results["steps"]:
        r = step["result"]
        status = r["status"] + (f" ({r['reason']})" if r.get("reason") else "")
        lines.append(f"| {step['name']} | {status} | {r.get('seconds', '')} |")
    for step in results["steps"]:
        if step["result"].get("table"):
            lines += ["", f"## {step['name']}: table", "", step["result"]["table"].rstrip()]
    for step in results["steps"]:
        if step["result"].get("output_tail"):
            lines += [
                "",
                f"## {step['name']}",
                "",
                "```",
                f"$ {shlex.join(step['argv'])}",
                step["result"]["output_tail"].rstrip(),
                "```",
            ]
    return "\n".join(lines) + "\n"


def step_numbers(text: str) -> set[int]:
    """'0,2-4' -> {0, 2, 3, 4}."""
    numbers: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        try:
            numbers.update(range(int(first), int(last or first) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--only takes step numbers such as 0,2-4, not {text!r}"
            ) from None
    return numbers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out", type=Path, help="folder for gpu_check.json, gpu_check.md and each step's outputs"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the steps and run nothing")
    parser.add_argument(
        "--only",
        type=step_numbers,
        help="run these steps alone (numbers as --dry-run prints them: 0,2-4); for machines that limit "
        "one command's time, so the check runs in parts",
    )
    parser.add_argument(
        "--part",
        type=int,
        choices=(1, 2, 3, 4),
        help=f"run one part (each fits a 6-minute command: no step starts after {PART_BUDGET_S} s unless "
        "--budget-s says otherwise); part 1 holds the most important steps, parts 3 and 4 issue 56's figures",
    )
    parser.add_argument(
        "--budget-s",
        type=int,
        help=f"start no step after this many seconds ({BUDGET_S}; with --part {PART_BUDGET_S})",
    )
    args = parser.parse_args()
    budget_s = args.budget_s or (PART_BUDGET_S if args.part else BUDGET_S)
    out = args.out.resolve()
    gpu = {} if args.dry_run else gpu_description()
    if args.dry_run:
        print(f"# dry run: planned for {DRY_RUN_GPUS} GPU of {DRY_RUN_GIB:.0f} GiB")
        for number, step in enumerate(plan(out, DRY_RUN_GPUS, DRY_RUN_GIB)):
            skip = f"  # skipped: {step.skip_reason}" if step.skip_reason else ""
            print(f"{number}\t{step.part}\t{step.name}\t{shlex.join(step.argv)}{skip}")
        return 0
    if not gpu:
        print(
            "gpu_check: torch sees no CUDA device; run it on a machine with a GPU (docs/gpu.md)",
            file=sys.stderr,
        )
        return 2
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + budget_s
    steps = plan(out, gpu["count"], gpu["memory_gib"])
    if args.only is not None:
        steps = [step for number, step in enumerate(steps) if number in args.only]
    steps = [step for step in steps if step.part in ((args.part,) if args.part else (1, 2))]
    for step in steps:
        print(f"gpu_check: {step.name}", flush=True)
        run_step(step, out, deadline)
        print(f"gpu_check:   {step.result['status']} {step.result.get('seconds', '')}", flush=True)
    results = {
        "gpu": gpu,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": time.monotonic() - started,
        "pytest": {xml.stem: pytest_counts(xml) for xml in sorted(out.glob("pytest_*.xml"))},
        "steps": [asdict(step) for step in steps],
    }
    name = f"gpu_check_part{args.part}" if args.part else "gpu_check"
    (out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown(results))
    print(f"gpu_check: wrote {out / name}.json and {out / name}.md")
    return 0 if all(s.result["status"] in ("ok", "skipped") for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
