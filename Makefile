# Two entry points: `make run` (the whole stack on the embedded default) and `make test`.
# Both create .venv and install what they need on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

PORT ?= 8000
export AGENTFLOW_WEB_PORT := $(PORT)
export AGENTFLOW_VAR_DIR ?= $(CURDIR)/var

# The suite's services: the machine's Postgres and Redis (docker compose up -d postgres redis
# elsewhere). Its own test database is created by pytest-django as test_<name>.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
TEST_BROKER_URL ?= redis://127.0.0.1:6379/15

.PHONY: run test lint typecheck bench chaos clean

$(INSTALLED): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(INSTALLED)

run: export AGENTFLOW_LOG_FORMAT ?= text
run: $(INSTALLED)
	rm -rf "$(AGENTFLOW_VAR_DIR)/metrics"  # counters start again with the processes that write them
	$(PY) manage.py migrate --noinput
	@$(PY) manage.py ensure_admin
	@echo "Refund form:   http://127.0.0.1:$(PORT)/refunds/new/"
	@echo "Admin:         http://127.0.0.1:$(PORT)/admin/"
	@echo "Health:        http://127.0.0.1:$(PORT)/healthz   Metrics: http://127.0.0.1:$(PORT)/metrics"
	@echo "Ctrl-C stops web, worker, beat and sandbox."
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" exec $(VENV)/bin/honcho --no-colour -f Procfile start

test: $(INSTALLED)
	bash .ci/services
	rm -rf var/test/metrics  # metric files of earlier runs' processes
	DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
	  REDIS_URL=$(TEST_BROKER_URL) AGENTFLOW_VAR_DIR=$(CURDIR)/var/test \
	  $(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(INSTALLED)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(INSTALLED)
	$(VENV)/bin/mypy agentflow

clean:
	rm -rf var/ .pytest_cache .mypy_cache .ruff_cache
