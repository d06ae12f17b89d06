"""The trainer's console lines: each verification, the under-fitting warning."""

from __future__ import annotations

from facetrain.train.evaluation import evaluation_line
from facetrain.train.metrics import UNDERFIT_CHECK_SHARE, UnderfitWatch
from facetrain.train.resume import nothing_left_to_train


def test_evaluation_line_names_accuracy_spread_auc_tar_and_pairs():
    outcome = {
        "accuracy": 0.9133,
        "accuracy_std": 0.012,
        "auc": 0.9621,
        "tar_at_far": {"0.01": 0.801},
        "pairs_file": "/data/lfw/pairs.csv",
    }
    line = evaluation_line(600, outcome)
    assert line == "step 600: verification 91.3 ± 1.2 % (AUC 0.962, TAR 80.1 % at FAR 1e-2) on pairs.csv"


def test_evaluation_line_with_only_the_accuracy_a_peer_rank_knows():
    assert evaluation_line(5, {"accuracy": 0.5, "step": 5}) == "step 5: verification 50.0 %"


def test_underfit_watch_warns_once_near_chance_at_the_check_point():
    watch = UnderfitWatch(total_steps=1000, num_classes=1505)
    check_step = int(UNDERFIT_CHECK_SHARE * 1000)
    assert watch.check(check_step - 1, 0.0) is None  # too early to judge
    warning = watch.check(check_step, 0.02)
    assert warning is not None and "under-fitted" in warning and "1505 classes" in warning
    assert watch.check(check_step + 10, 0.0) is None  # said once


def test_underfit_watch_quiet_when_the_run_fits():
    watch = UnderfitWatch(total_steps=100, num_classes=30)
    assert watch.check(50, 0.9) is None
    assert watch.checked


def test_underfit_watch_few_classes_counts_chance():
    watch = UnderfitWatch(total_steps=100, num_classes=2)  # chance is 50 %
    assert watch.check(40, 0.52) is not None


def test_a_resume_at_or_past_the_last_step_is_noted():
    assert nothing_left_to_train(3, 4) is None
    assert "step 4 is already at train.steps=4" in nothing_left_to_train(4, 4)
    assert "step 10 is past train.steps=4" in nothing_left_to_train(10, 4)
