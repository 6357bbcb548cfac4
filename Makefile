# The two commands of the README:
#   make workbook  - set up the venv and run the notebook series headless (the main job)
#   make test      - set up the venv with dev tools, lint, and run the test suite
VENV ?= .venv
PYTEST_ARGS ?= -m "not slow and not gpu"

.PHONY: workbook test setup setup-dev lint format demo clean

setup:
	VENV=$(VENV) bash tools/setup_venv.sh notebooks

setup-dev:
	VENV=$(VENV) bash tools/setup_venv.sh dev

workbook: setup
	$(VENV)/bin/kdtree notebooks run --all

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# pytest exits 5 when it collected no tests: that is a failure, not a pass.
test: setup-dev lint
	$(VENV)/bin/pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

demo: setup
	$(VENV)/bin/kdtree demo

clean:
	rm -rf runs .pytest_cache .ruff_cache
