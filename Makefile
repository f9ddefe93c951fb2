# Two entry points: `make run` (the whole stack on the embedded default) and `make test`.
# Both create .venv on first use and install exactly what the hashed lock names (`make lock`
# writes it from pyproject.toml), then the project itself without dependencies.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

PORT ?= 8000
export AGENTFLOW_VAR_DIR ?= $(CURDIR)/var
export AGENTFLOW_WEB_PORT := $(PORT)

# The lock: runtime (what the image installs) and runtime + dev tools (what .venv installs),
# resolved once for every platform on Python 3.11, each file pinned and hashed.
LOCK := requirements.lock
DEV_LOCK := requirements-dev.lock
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
# `make lock LOCK_FLAGS=--upgrade` moves every pin to the newest allowed; `--offline` resolves
# from uv's cache alone. By default existing pins are kept and only new needs are added.
LOCK_FLAGS ?=
COMPILE := $(UV) pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes \
	--quiet --custom-compile-command "make lock" $(LOCK_FLAGS)

# `make run` needs no configuration: unless DJANGO_SECRET_KEY is set, it uses a random key
# made once for this checkout (settings refuse to start without one when DEBUG is off).
DEV_KEY := $(AGENTFLOW_VAR_DIR)/secret-key.txt
WITH_KEY = DJANGO_SECRET_KEY="$${DJANGO_SECRET_KEY:-$$(cat $(DEV_KEY))}"

# The suite's services: the machine's Postgres and Redis (docker compose up -d postgres redis
# elsewhere). Its own test database is created by pytest-django as test_<name>.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
TEST_BROKER_URL ?= redis://127.0.0.1:6379/15
# The suite runs in this many shards at once (pytest-xdist; tests/support/shards.py gives each
# its own database, Redis database, var/ directory and ports); 0 runs it in this one process.
TEST_SHARDS ?= 3
SHARD_ARGS := $(if $(filter 0,$(TEST_SHARDS)),,-n $(TEST_SHARDS))

.PHONY: run test test-matrix docs screenshots lock lint typecheck clean

$(INSTALLED): $(DEV_LOCK) pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r $(DEV_LOCK)
	$(PY) -m pip install --quiet --no-deps -e .
	@$(PY) -m pip check >/dev/null || { $(PY) -m pip check; \
	  echo "pyproject.toml needs what $(DEV_LOCK) does not pin: run 'make lock'" >&2; exit 1; }
	touch $(INSTALLED)

$(DEV_KEY):
	mkdir -p -m 700 $(@D)
	umask 077 && $(PYTHON) -c "import secrets; print(secrets.token_urlsafe(50))" > $@

run: export AGENTFLOW_LOG_FORMAT ?= text
run: export AGENTFLOW_METRICS_PUBLIC ?= 1  # served on 127.0.0.1 only: the printed URL just works
# var/ holds sessions, customers' requests, the sandbox's state and the key: the owner's alone.
# Everything run makes is made under umask 077 (0700 directories, 0600 files), and what an
# earlier run left readable is closed first.
run: $(INSTALLED) $(DEV_KEY)
	chmod -R go-rwx "$(AGENTFLOW_VAR_DIR)"
	rm -rf "$(AGENTFLOW_VAR_DIR)/metrics"  # counters start again with the processes that write them
	umask 077 && $(WITH_KEY) $(PY) manage.py migrate --noinput
	@umask 077 && $(WITH_KEY) $(PY) manage.py ensure_admin
	@echo "Refund form:   http://127.0.0.1:$(PORT)/refunds/new/"
	@echo "Admin:         http://127.0.0.1:$(PORT)/admin/"
	@echo "Health:        http://127.0.0.1:$(PORT)/healthz   Metrics: http://127.0.0.1:$(PORT)/metrics"
	@echo "Ctrl-C stops web, worker, beat and sandbox."
	umask 077 && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(WITH_KEY) \
	  exec $(VENV)/bin/honcho --no-colour -f Procfile start

# What the suite's processes read, in `make test` and in every leg of `make test-matrix`.
TEST_ENV = DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
	  REDIS_URL=$(TEST_BROKER_URL) AGENTFLOW_VAR_DIR=$(CURDIR)/var/test PYTHONPATH=$(CURDIR) \
	  AGENTFLOW_LOCAL_MASTER_KEY=1 \
	  DJANGO_SECRET_KEY="$${DJANGO_SECRET_KEY:-$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(50))')}"

test: $(INSTALLED)
	bash .ci/services
	rm -rf var/test/metrics var/test/shard*/metrics  # metric files of earlier runs' processes
	$(TEST_ENV) $(VENV)/bin/pytest -p tests.support.shards $(SHARD_ARGS) $(PYTEST_ARGS)

# The supported matrix (noxfile.py): tests/agentflow and tests/host on each supported Python,
# Django and Celery, on the machine's pyenv interpreters (PYENV_ROOT), never downloaded ones.
# `make test-matrix NOX_ARGS="-t host"` runs the host legs alone (as CI does), `NOX_ARGS="-s
# 'engine(py3.12-django6.1-celery5.7)'"` one leg, `NOX_ARGS=-l` lists them.
PYENV_ROOT ?= $(HOME)/.pyenv
MATRIX_PATH := $(subst $(eval) ,:,$(wildcard $(PYENV_ROOT)/versions/3.1[123].*/bin))
NOX_ARGS ?=
test-matrix: $(INSTALLED) $(UV)
	bash .ci/services
	$(TEST_ENV) PATH="$(CURDIR)/$(VENV)/bin:$(MATRIX_PATH):$$PATH" UV_PYTHON_DOWNLOADS=never \
	  $(VENV)/bin/nox --no-color $(NOX_ARGS) -- $(SHARD_ARGS) $(PYTEST_ARGS)

# The manual (docs/): Sphinx with MyST pages and autodoc, built as the suite builds it
# (tests/config/unit/test_docs.py: warnings are errors, internal links and references checked),
# then served from this machine only until Ctrl-C.
DOCS_PORT ?= 8001
docs: $(INSTALLED)
	$(VENV)/bin/sphinx-build -W --keep-going -n -q docs docs/_build/html
	@echo "Docs:          http://127.0.0.1:$(DOCS_PORT)/"
	$(PY) -m http.server $(DOCS_PORT) --bind 127.0.0.1 --directory docs/_build/html

# The README's pictures (static/readme/*.png), taken by the browser tests' Chromium from a real
# refund: run it again after changing the refund pages or the admin (same services as `test`).
screenshots:
	README_SHOTS_DIR=$(CURDIR)/static/readme $(MAKE) test TEST_SHARDS=0 \
	  PYTEST_ARGS="-q tests/config/acceptance/test_readme_screenshots.py"

$(UV):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "uv==$(UV_VERSION)"

# Both with every extra: the site uses them all. The groups (pyproject.toml's
# [dependency-groups]) are this repository's own needs, never the wheel's.
lock: $(UV)
	$(COMPILE) --all-extras --group dev -o $(DEV_LOCK)
	$(COMPILE) --all-extras --group site --constraint $(DEV_LOCK) -o $(LOCK)

# The import contracts (pyproject.toml's [tool.importlinter]) beside ruff; --no-cache: a graph
# cached before a package appeared would miss imports of it, and it writes nothing here.
lint: $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(INSTALLED)
	DJANGO_DEBUG=1 $(VENV)/bin/mypy agentflow

clean:
	rm -rf var/ docs/_build .pytest_cache .mypy_cache .ruff_cache
