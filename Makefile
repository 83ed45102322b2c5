# The two commands in the README do all set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIPLOG := $(VENV)/pip-install.log

.PHONY: demo test lint typecheck unit bench clean

# One install step for everything; its output goes to a log, shown only when it fails.
$(STAMP): pyproject.toml
	@echo "setting up $(VENV) (log: $(PIPLOG))"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --upgrade pip > $(PIPLOG) 2>&1 || (cat $(PIPLOG); exit 1)
	@$(BIN)/python -m pip install -e '.[dev]' >> $(PIPLOG) 2>&1 || (tail -n 60 $(PIPLOG); exit 1)
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mkctl demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy federation

unit: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python bench/kubesim_bench.py
	$(BIN)/python bench/agent_bench.py
	$(BIN)/python bench/dispatch_bench.py
	$(BIN)/python bench/e2e_bench.py

clean:
	rm -rf $(VENV) state .pytest_cache .mypy_cache .ruff_cache
