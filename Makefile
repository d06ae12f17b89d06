# facetrain: `make demo` runs the main job on the built-in synthetic dataset, `make test` runs the suite.
# Both create .venv in the checkout and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Extra arguments for pytest, e.g. `make test PYTEST_ARGS="-m 'not slow'"`.
PYTEST_ARGS ?=

.PHONY: install test demo bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --quiet -e ".[app,test]"
	touch $(STAMP)

# One pytest-xdist session, one worker per core (at most 4): the tests that start several ranks at once
# (tests/conftest.py marks them `ranks`) run one after another on one worker, beside the in-process tests
# on the others, a module at a time (tests/conftest.py's groups, `--dist loadgroup`).
test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=25 -n auto --maxprocesses 4 --dist loadgroup $(PYTEST_ARGS)

demo: $(STAMP)
	bash tools/demo.sh

bench: $(STAMP)
	$(BIN)/facetrain bench head --overwrite
	$(BIN)/facetrain bench head --capacity --world-sizes 1 --largest tiled_bf16,tiled,sharded --memory-limit-gb 19 --overwrite
	$(BIN)/facetrain bench data
	$(BIN)/facetrain bench train
	$(BIN)/facetrain bench eval
	$(BIN)/facetrain bench pipeline
	$(BIN)/facetrain bench scaling --overwrite

lint: $(STAMP)
	$(BIN)/ruff check facetrain tests tools examples
	$(BIN)/ruff format --check facetrain tests tools examples
	$(BIN)/python tools/import_contract.py

clean:
	rm -rf $(VENV) runs data/synth
