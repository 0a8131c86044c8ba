# Ragline: `make up` runs the local stack, `make test` runs every check against it.
SHELL := /bin/bash
# The virtual environment the local scripts use too (deploy/local/lib.sh): RAGLINE_VENV, else .venv.
VENV ?= $(or $(RAGLINE_VENV),.venv)
# This checkout's code first, whichever venv holds the packages: another checkout's venv has that
# checkout's editable install, whose `ragline up` would run that checkout's scripts and code.
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
STACK := bash deploy/local/stack.sh
# A tool run here against the local stack reaches its servers where deploy/local/lib.sh puts them:
# on a moved port (RAGLINE_REDIS_PORT, RAGLINE_OPENSEARCH_PORT) too, not another stack's default one.
STACK_ENV := source deploy/local/lib.sh &&

.PHONY: install up demo down status test soak bench bench-quick lint format clean-state

install:  ## venv, Python packages, Debian packages and OpenSearch artifacts (idempotent)
	@bash deploy/local/setup.sh

up: install  ## start OpenSearch (k-NN), Redis, the S3 server, a worker and the API on 127.0.0.1
	@$(VENV)/bin/ragline up

demo: install  ## the main job: start the stack, bulk-load the SQLite docs, search them over MCP
	@bash deploy/local/demo.sh

down:  ## stop the local stack
	@$(STACK) down

status:  ## report each local service (a stopped one is a report, not a failure of make; the script still exits 3)
	@$(STACK) status || [ $$? -eq 3 ]

test: install  ## ruff, mypy --strict and pytest (unit, integration, e2e) against the real stack
	@bash deploy/local/test.sh

soak: install  ## the fault tests with 1,000 documents and three rounds of each fault, the cluster test with 500
	@RAGLINE_SOAK_DOCS=$${RAGLINE_SOAK_DOCS:-1000} RAGLINE_SOAK_ROUNDS=$${RAGLINE_SOAK_ROUNDS:-3} \
		RAGLINE_TEST_CLUSTER_DOCS=$${RAGLINE_TEST_CLUSTER_DOCS:-500} \
		bash deploy/local/test.sh -s tests/integration/test_faults.py tests/integration/test_cluster.py

bench: up  ## throughput, latency, quality and memory vs baselines -> bench/results/
	@$(STACK_ENV) $(VENV)/bin/python -m bench

bench-quick: up
	@$(STACK_ENV) $(VENV)/bin/python -m bench --quick

lint: install
	@$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

format: install
	@$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

clean-state: down  ## delete local data (OpenSearch indexes, Redis, blobs, logs)
	rm -rf "$(or $(RAGLINE_STATE_DIR),.ragline)"
