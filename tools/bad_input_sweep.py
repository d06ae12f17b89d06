"""A randomised bad-input sweep: bad config values and bad files across facetrain's commands.

    python tools/bad_input_sweep.py --cases 300 --seed 0 --out sweep.json

Each case is one command line (`config`, `train`, `eval`, `export`, `embed`, `compare`, `align`,
`pairs`, `import insightface`, `import dlib`) with one or more bad inputs drawn at random: a config key
set to a wrong type, a negative, huge, NaN or infinite number, an odd string, given by `--set` or in
the YAML file; a missing path, a folder where a file belongs, a text file named .jpg, an empty file, a
PNG cut short, a 30000x30000 PNG, a plain pickle, a bad option value; and issue 38's hostile files: a
TIFF bomb named .png, a named pipe, a YAML alias bomb, a Latin-1 config, an ONNX model whose Constant
reads `secret.txt`, a dlib file whose shape wraps int64, /dev/zero, a TorchScript file that writes to
a victim file (which must stay untouched), a symlink to nothing as the output. A finding is a Python traceback, an exit
status other than 0 or 2, or 0 where an input was certainly bad.

Commands run in a worker process that imports facetrain once and invokes the command line in
process (click's test runner), so a case costs milliseconds to a few seconds instead of a fresh
interpreter's torch import; a case that takes longer than `--timeout` is a finding and its worker is
replaced. Training cases use a tiny synthetic set (32x32, 2 steps), so most fail in validation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import bad_files  # noqa: E402

TRACEBACK = "Traceback (most recent call last)"
BAD_VALUES = {  # YAML text, and whether it is certainly refused (a wrong type)
    int: [("-1", False), ("0", False), ("99999999999999999999", False), ("1e400", True), (".nan", True),
          (".inf", True), ("abc", True), ("[]", True), ("{}", True), ("1.5", True), ("''", True)],
    float: [(".nan", True), (".inf", False), ("-.inf", False), ("-1", False), ("1e308", False),
            ("abc", True), ("[1]", True), ("{}", True), ("''", True)],
    str: [("''", False), ("123", False), ("[]", True), ("{a: 1}", True), ("/nonexistent/x", False),
          ("'" + "x" * 300 + "'", False), ("'é ünïcode'", False)],
    bool: [("maybe", True), ("2", True), ("[]", True), ("'yes please'", True)],
    list: [("[]", False), ("[1]", False), ("x", True), ("[.nan, .nan]", False), ("[1, 2, 3]", False),
           ("[-1, -1]", False), ("[99999999999, 99999999999]", False), ("{}", True)],
    dict: [("[]", True), ("x", True), ("{m: .nan}", False), ("{bogus: 1}", False)],
}  # fmt: skip


def config_keys() -> list[tuple[str, type]]:
    """Every leaf key of the config and the kind of value it takes."""
    from facetrain.train.run_config import Config

    keys = []

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            hint = hints[field.name]
            if dataclasses.is_dataclass(hint):
                walk(hint, f"{prefix}{field.name}.")
                continue
            union = typing.get_origin(hint) in (typing.Union, types.UnionType)
            kinds = [k for k in (typing.get_args(hint) if union else (hint,)) if k is not type(None)]
            kind = typing.get_origin(kinds[0]) or kinds[0]
            keys.append((prefix + field.name, kind if kind in BAD_VALUES else str))

    walk(Config, "")
    return keys


class Fixtures:
    """What the cases point at: a tiny trained run and its export, good images and bad files."""

    def __init__(self, root: Path):
        self.root = root
        self.bad = root / "bad"
        self.bad.mkdir(parents=True, exist_ok=True)
        self.files = {
            "huge.png": bad_files.huge_png(self.bad / "huge.png"),
            "cut.png": bad_files.cut_png(self.bad / "cut.png"),
            "notes.jpg": bad_files.text_named_like_an_image(self.bad / "notes.jpg"),
            "empty.png": bad_files.empty_file(self.bad / "empty.png"),
            "pickle.pth": bad_files.plain_pickle(self.bad / "pickle.pth"),
            "dir.jpg": self._folder(self.bad / "dir.jpg"),
            "missing": self.bad / "missing" / "nothing.png",
            "empty_dir": self._folder(self.bad / "empty_dir"),
            # issue 38's hostile files
            "tiff.png": bad_files.tiff_bomb(self.bad / "tiff.png"),
            "fifo.png": bad_files.named_pipe(self.bad / "fifo.png"),
            "bomb.yaml": bad_files.alias_bomb_yaml(self.bad / "bomb.yaml"),
            "latin1.yaml": bad_files.latin1_yaml(self.bad / "latin1.yaml"),
            "external.onnx": bad_files.external_data_onnx(self.bad / "external.onnx"),
            "wrap.dat": bad_files.wrapping_dlib(self.bad / "wrap.dat"),
            "dangling": bad_files.dangling_symlink(self.bad / "dangling"),
            "evil.pt": bad_files.evil_torchscript(self.bad / "evil.pt", self.bad / "victim.txt"),
        }
        (self.bad / "victim.txt").write_text("untouched\n")
        self.config = self._write_config(root / "tiny.yaml", root / "synth", root / "run")

    @staticmethod
    def _folder(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        return path

    @staticmethod
    def _write_config(path: Path, data: Path, output: Path) -> Path:
        import yaml

        synth = {"identities": 6, "images_per_identity": 4, "heldout_identities": 4,
                 "heldout_images_per_identity": 3, "pairs_folds": 2, "pairs_per_fold": 6, "image_size": 32}  # fmt: skip
        config = {
            "data": {"source": "synthetic", "path": str(data), "image_size": [32, 32], "num_workers": 0,
                     "synth": synth},
            "model": {"backbone": "small", "embedding_size": 16},
            "head": {"margin": "cosface", "scale": 16.0, "margin_params": {"m": 0.2}},
            "optim": {"lr": 0.05, "schedule": "constant"},
            "train": {"output_dir": str(output), "batch_size": 8, "steps": 2, "log_every": 1},
            "checkpoint": {"every": 2},
        }  # fmt: skip
        path.write_text(yaml.safe_dump(config))
        return path

    def prepare(self, run) -> None:
        """Train the tiny run and export it; `run` executes a command line in the worker."""
        for args in (
            ["train", "-c", str(self.config)],
            ["export", str(self.root / "run"), "-o", str(self.export)],
        ):
            outcome = run(args)
            if outcome["code"] != 0:
                raise SystemExit(f"sweep set-up failed: facetrain {' '.join(args)}:\n{outcome['output']}")
        heldout = self.root / "synth" / "heldout"
        self.images = self._folder(self.root / "images")
        for index, image in enumerate(sorted(heldout.glob("*/*.png"))[:6]):
            (self.images / f"{index}.png").write_bytes(image.read_bytes())
        self.mixed = self._folder(self.root / "mixed")
        for source in (*sorted(self.images.iterdir())[:3], self.files["notes.jpg"], self.files["cut.png"]):
            (self.mixed / source.name).write_bytes(source.read_bytes())
        self.identities = self._folder(self.root / "identities")
        for identity in sorted(heldout.iterdir())[:2]:
            target = self._folder(self.identities / identity.name)
            for image in sorted(identity.glob("*.png"))[:3]:
                (target / image.name).write_bytes(image.read_bytes())
        (self.identities / identity.name / "notes.jpg").write_text("not an image")
        self.pairs = heldout / "pairs.txt"

    @property
    def export(self) -> Path:
        return self.root / "export"


# A choice is (argument text, bad): bad means the case must fail with exit 2 (None: either is fine)
def _files(fx: Fixtures, *names: str) -> list[tuple[str, bool | None]]:
    return [(str(fx.files[name]), True) for name in names]


def command_case(fx: Fixtures, rng: random.Random, number: int) -> tuple[list[str], bool | None]:
    """One command line with bad inputs, and whether it must fail."""
    out = fx.root / "out" / str(number)
    model = rng.choice(
        [(str(fx.root / "run"), False), (str(fx.export), False)]
        + _files(fx, "missing", "notes.jpg", "empty_dir", "pickle.pth", "huge.png", "evil.pt", "fifo.png")
    )
    image = rng.choice(
        [(str(fx.images / "0.png"), False)]
        + _files(
            fx, "huge.png", "cut.png", "notes.jpg", "empty.png", "dir.jpg", "missing", "tiff.png", "fifo.png"
        )
    )
    command = rng.choice(["eval", "export", "embed", "compare", "align", "pairs", "import", "config"])
    if command == "eval":
        target = rng.choice(
            [(f"--pairs={fx.pairs}", False), (f"--folder={fx.identities}", False)]
            + [
                (f"--pairs={path}", True)
                for path, _ in _files(fx, "missing", "notes.jpg", "empty.png", "huge.png")
            ]
            + [(f"--folder={path}", True) for path, _ in _files(fx, "missing", "empty_dir", "notes.jpg")]
        )
        extra = rng.choice([("--batch-size=0", True), ("--batch-size=99999999999999999999", None),
                            ("--workers=-1", True), ("--folds=1", True), ("--seed=-5", None), ("--quiet", False)])  # fmt: skip
        parts = [model, target, extra, (f"--out={out}", False)]
        args = ["eval", model[0], target[0], extra[0], f"--out={out}"]
    elif command == "export":
        formats = rng.choice([("--formats=safetensors", False), ("--formats=bogus", True), ("--formats=", True),
                              ("--formats=onnx,onnx", None)])  # fmt: skip
        target = rng.choice(
            [(str(out), False), (str(fx.files["notes.jpg"]), True), (str(fx.root / "run"), None)]
            + _files(fx, "dangling")
        )
        parts = [model, formats, target]
        args = ["export", model[0], "-o", target[0], formats[0], "--quiet"]
    elif command == "embed":
        source = rng.choice([(str(fx.images), False), (str(fx.mixed), False), image])
        target = rng.choice(
            [(f"{out}.npy", False), (f"{out}.csv", False), (f"{out}.txt", True), (str(fx.images), True)]
            + _files(fx, "dangling")
        )
        size = rng.choice([("--batch-size=1", False), ("--batch-size=0", True), ("--batch-size=x", True)])
        parts = [model, source, target, size]
        args = ["embed", model[0], source[0], "-o", target[0], size[0]]
    elif command == "compare":
        threshold = rng.choice([("--threshold=0.3", False), ("--threshold=nan", None), ("--threshold=inf", None),
                                ("--threshold=x", True), ("--threshold=-2", None)])  # fmt: skip
        parts = [model, image, threshold]
        args = ["compare", model[0], str(fx.images / "1.png"), image[0], threshold[0]]
    elif command == "align":
        source = rng.choice([(str(fx.mixed), False), (str(fx.bad), False), (str(fx.images), False)]
                            + _files(fx, "missing", "notes.jpg", "empty_dir"))  # fmt: skip
        target = rng.choice(
            [(str(out), False), (str(fx.files["notes.jpg"]), True), (f"{source[0]}/inside", True)]
        )
        size = rng.choice([("--size=112", False), ("--size=0", True), ("--size=abc", True), ("--size=1x1", None),
                           ("--size=112x", True), ("--size=-5", True), ("--size=100000", True)])  # fmt: skip
        workers = rng.choice([("--workers=1", False), ("--workers=0", True), ("--workers=2", False)])
        parts = [source, target, size, workers]
        args = ["align", source[0], "-o", target[0], size[0], workers[0], "--quiet"]
    elif command == "pairs":
        root = rng.choice(
            [(str(fx.identities), False)] + _files(fx, "missing", "notes.jpg", "empty_dir", "huge.png")
        )
        folds = rng.choice(
            [("--folds=2", False), ("--folds=1", True), ("--folds=1000000", None), ("--folds=x", True)]
        )
        seed = rng.choice([("--seed=0", False), ("--seed=-1", None), ("--seed=99999999999999999999", None)])
        parts = [root, folds, seed]
        args = ["pairs", root[0], "-o", f"{out}.csv", folds[0], seed[0]]
    elif command == "config":  # a hostile config file itself
        config = rng.choice(_files(fx, "bomb.yaml", "latin1.yaml", "fifo.png", "dir.jpg", "missing"))
        parts = [config]
        args = ["config", "-c", config[0]]
    elif rng.random() < 0.3:
        weights = rng.choice(
            _files(fx, "wrap.dat", "fifo.png", "notes.jpg", "empty.png") + [("/dev/zero", True)]
        )
        parts = [weights]
        args = ["import", "dlib", weights[0], "-o", str(out), "--quiet"]
    else:
        weights = rng.choice(
            _files(fx, "missing", "notes.jpg", "empty.png", "pickle.pth", "huge.png", "empty_dir", "external.onnx",
                   "fifo.png")
        )  # fmt: skip
        arch = rng.choice([("--arch=iresnet50", False), ("--arch=bogus", True)])
        parts = [weights, arch]
        args = ["import", "insightface", weights[0], arch[0], "-o", str(out), "--quiet"]
    flags = [bad for _, bad in parts]
    return args, (True if True in flags else None)


def config_case(fx: Fixtures, rng: random.Random, keys, number: int) -> tuple[list[str], bool | None, str]:
    """`config` or `train` with one config key set to a bad value, by --set or in the YAML file; also
    the key and value, for the report (a value written into the file is not in the arguments)."""
    import yaml

    key, kind = rng.choice(keys)
    value, certainly_bad = rng.choice(BAD_VALUES[kind])
    command = rng.choice(["config", "train", "train"])
    run_dir = fx.root / "runs" / str(number)
    fresh = {"train.output_dir": run_dir, "data.path": fx.root / "data" / str(number)}
    if not key.startswith("data."):
        del fresh["data.path"]
    config = fx.config
    sets = [arg for name, path in fresh.items() if name != key for arg in ("--set", f"{name}={path}")]
    if rng.random() < 0.5:
        sets += ["--set", f"{key}={value}"]
    else:
        tree = yaml.safe_load(fx.config.read_text())
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
        config = fx.root / "configs" / f"{number}.yaml"
        config.parent.mkdir(exist_ok=True)
        config.write_text(yaml.safe_dump(tree))
    return [command, "-c", str(config), *sets], (True if certainly_bad else None), f"{key}={value}"


def judge(outcome: dict, must_fail: bool | None) -> str | None:
    """What is wrong with a case's outcome, or None."""
    if outcome.get("timeout"):
        return "timeout"
    if outcome.get("exception") or TRACEBACK in outcome["output"]:
        return "traceback"
    if outcome["code"] not in (0, 2):
        return f"exit status {outcome['code']}"
    if must_fail and outcome["code"] == 0:
        return "exit status 0 for a bad input"
    return None


class Worker:
    """A process that runs command lines in process and answers one JSON line each, in the work folder:
    a relative path a case gives (an output_dir of 'é ünïcode') lands there, never in the checkout."""

    def __init__(self, log: Path):
        self.log = log.open("a")
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=log.parent,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
            start_new_session=True,  # its own process group, so a stuck case's children go with it
        )

    def run(self, args: list[str], timeout: float) -> dict:
        self.process.stdin.write(json.dumps(args) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            return {"code": None, "output": "", "timeout": bool(not ready)} | (
                {} if not ready else {"exception": "the worker died"}
            )
        return json.loads(line)

    def close(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def serve() -> None:
    """The worker: one command line a JSON line on stdin, its outcome a JSON line on the private fd."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything writing to fd 1 directly (a child process) must not corrupt the answers
    from click.testing import CliRunner

    from facetrain.cli import main

    runner = CliRunner()
    for line in sys.stdin:
        result = runner.invoke(main, json.loads(line), catch_exceptions=True)
        exception = None
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            exception = "".join(traceback.format_exception(*result.exc_info))
        output = result.stdout + result.stderr
        answers.write(json.dumps({"code": result.exit_code, "output": output, "exception": exception}) + "\n")
        answers.flush()


def sweep(cases: int, seed: int, timeout: float, work: Path) -> dict:
    rng = random.Random(seed)
    fixtures = Fixtures(work)
    worker = Worker(work / "worker.log")
    fixtures.prepare(lambda args: worker.run(args, timeout * 4))
    keys = config_keys()
    findings, counts, started = [], {}, time.monotonic()
    for number in range(cases):
        if rng.random() < 0.5:
            args, must_fail, given = config_case(fixtures, rng, keys, number)
        else:
            (args, must_fail), given = command_case(fixtures, rng, number), None
        if worker.process.poll() is not None:
            worker = Worker(work / "worker.log")
        outcome = worker.run(args, timeout)
        counts[args[0]] = counts.get(args[0], 0) + 1
        problem = judge(outcome, must_fail)
        if problem:
            excerpt = outcome.get("exception") or outcome["output"]
            findings.append(
                {"case": number, "args": args, "problem": problem, "input": given, "output": excerpt[-2000:]}
            )
            print(f"case {number}: {problem}: facetrain {' '.join(args)}", flush=True)
    worker.close()
    if (fixtures.bad / "victim.txt").read_text() != "untouched\n":
        findings.append({"case": None, "args": [], "problem": "evil.pt's program ran and wrote its victim",
                         "input": None, "output": ""})  # fmt: skip
    return {
        "cases": cases,
        "seed": seed,
        "seconds": round(time.monotonic() - started, 1),
        "commands": counts,
        "findings": findings,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bad_input_sweep.json"))
    parser.add_argument("--timeout", type=float, default=60.0, help="Seconds a case may take.")
    parser.add_argument("--work", type=Path, help="Folder for the fixtures [default: a temporary one].")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        serve()
        return
    with tempfile.TemporaryDirectory(prefix="facetrain-sweep-") as temporary:
        work = options.work or Path(temporary)
        report = sweep(options.cases, options.seed, options.timeout, work)
    options.out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{report['cases']} cases in {report['seconds']} s ({report['commands']}): "
        f"{len(report['findings'])} findings; report in {options.out}"
    )
    sys.exit(1 if report["findings"] else 0)


if __name__ == "__main__":
    main()
