"""What the tests share and the application does not ship: multi-rank runs through facetrain's worker
pool (`distributed`), training tiny runs through the CLI (`train_helpers`), fault injection and the
faulted runs' helpers (`fault_injection`, `fault_helpers`), hostile inputs (`hostile_helpers`, `bad_files`,
which tools/bad_input_sweep.py uses too), head plans, head problems and the margins by what they read
(`head_problems`), the papers' margins (`margin_references`), the Triton cases, small models
(`small_models`, `pipeline_models`), image files and sets (`images`, `eval_sets`), a small IJB set,
re-id folders and a local Slurm cluster (`slurm_cluster`). Tests import them as `tests.support.NAME`;
nothing under facetrain/ does, and no test imports another test module.
"""
