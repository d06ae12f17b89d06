"""The kinds of evaluation `facetrain eval` dispatches through (`facetrain.eval.kinds.EVAL_KINDS`), tested
over the registry: a kind registered without its option on the command, or an option one kind reads
that another accepts, fails here. Usage errors come before the model is read, so no model is needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.cli.eval_cmd import eval_command
from facetrain.eval.embedding import EmbedSettings
from facetrain.eval.kinds import EVAL_KINDS, EvalRequest, eval_kind

COMMAND_OPTIONS = {option for param in eval_command.params for option in param.opts}
# a value each kind's option takes on the command line (--reid takes two)
VALUES = {"--reid": ["query", "gallery"]}
# a value for each option only some kinds read
OPTION_VALUES = {"--images": ["i"], "--skip-missing": [], "--seed": ["1"], "--folds": ["3"],
                 "--ijb-target": ["IJBB"], "--rerank": []}  # fmt: skip


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["eval", "no-model", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("name", EVAL_KINDS.names())
def test_each_kind_is_chosen_by_an_option_of_the_command(name):
    kind = eval_kind(name)
    assert kind.option in COMMAND_OPTIONS
    assert set(kind.options) <= COMMAND_OPTIONS and set(kind.options) <= set(OPTION_VALUES)


@pytest.mark.parametrize("name", EVAL_KINDS.names())
def test_an_option_of_another_kind_is_a_usage_error(name):
    kind = eval_kind(name)
    chosen = [kind.option, *VALUES.get(kind.option, ["x"])]
    for option, values in OPTION_VALUES.items():
        if option not in kind.options:
            code, output = invoke(*chosen, option, *values)
            assert (
                code == 2
                and f"{option} applies to" in output
                and kind.option not in output.split("applies")[1]
            )


def test_two_kinds_at_once_or_none_is_a_usage_error():
    code, output = invoke("--pairs", "p.txt", "--market", "m")
    assert code == 2 and "give exactly one of" in output
    code, output = invoke()
    assert code == 2 and all(eval_kind(name).option in output for name in EVAL_KINDS.names())


@pytest.mark.parametrize("name", EVAL_KINDS.names())
def test_each_kind_writes_its_report_into_the_out_folder(name, tmp_path):
    target = ("query", "gallery") if name == "reid" else tmp_path / "input"
    request = EvalRequest(target, tmp_path / "out", Path("model"), embedding={})
    paths = eval_kind(name).report_paths(request)
    assert paths and all(path.parent == tmp_path / "out" for path in paths)


def test_a_request_embeds_at_the_model_input_size():
    class Model:
        image_size = (24, 20)

    request = EvalRequest(Path("p"), Path("out"), Path("m"), embedding={"batch_size": 4, "flip": False})
    assert request.settings(Model()) == EmbedSettings((24, 20), batch_size=4, flip=False)
