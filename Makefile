# The two commands in the README do all set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIPLOG := $(VENV)/pip-install.log

.PHONY: demo test lint typecheck unit bench clean lock wheels image browser

# One install step for everything; its output goes to a log, shown only when it fails.
# mkd with every extra, editable, at the versions pinned in requirements/dev.lock (the same versions
# CI and the image install); sim/ is the mkd-sim distribution that carries kubesim.
$(STAMP): pyproject.toml sim/pyproject.toml requirements/dev.lock
	@echo "setting up $(VENV) (log: $(PIPLOG))"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --upgrade pip > $(PIPLOG) 2>&1 || (cat $(PIPLOG); exit 1)
	@$(BIN)/python -m pip install -c requirements/dev.lock -e ./sim -e '.[dev]' >> $(PIPLOG) 2>&1 \
		|| (tail -n 60 $(PIPLOG); exit 1)
	@touch $(STAMP)

# Re-resolve the lock files after a dependency changed in pyproject.toml or sim/pyproject.toml
# (needs PyPI). prod.lock is resolved inside dev.lock, so production runs the versions CI tested.
lock: $(STAMP)
	$(BIN)/uv pip compile requirements/dev.in -o requirements/dev.lock --python-version 3.11 \
		--no-emit-package mkd --no-emit-package mkd-sim -q
	$(BIN)/uv pip compile requirements/prod.in -c requirements/dev.lock -o requirements/prod.lock \
		--python-version 3.11 --no-emit-package mkd -q

# The two wheels: dist/mkd-*.whl (production) and dist/mkd_sim-*.whl (the simulator).
wheels: $(STAMP)
	rm -rf dist && $(BIN)/python -m pip wheel -q --no-deps -w dist . ./sim

# The production image (Dockerfile), where a container builder is installed and running.
image:
	@if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then \
		docker build -t mkd:$$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml) . ; \
	elif command -v podman >/dev/null 2>&1; then \
		podman build -t mkd:$$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml) . ; \
	else echo "make image: no container builder here (docker with a running daemon, or podman)"; exit 2; fi

demo: $(STAMP)
	$(BIN)/mkctl demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy federation dispatcher worker_agent mkctl kubesim migrations

unit: $(STAMP) browser
	$(BIN)/pytest $(PYTEST_ARGS)

# The dashboard's browser test needs Chromium and chromedriver: installed here when run as root with
# apt; never fails the build (without them the test skips and says so).
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		{ apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }; } \
		&& echo "installed chromium + chromium-driver for the dashboard's browser test" \
		|| echo "could not install chromium (apt failed): the dashboard's browser test will skip"; \
	else echo "chromium not installed (needs root and apt-get): the dashboard's browser test will skip"; fi

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python bench/kubesim_bench.py
	$(BIN)/python bench/agent_bench.py
	$(BIN)/python bench/dispatch_bench.py
	$(BIN)/python bench/e2e_bench.py
	$(BIN)/python bench/whatif_bench.py

clean:
	rm -rf $(VENV) state dist build .pytest_cache .mypy_cache .ruff_cache
