# Rewind's plain entry points. `make demo` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# two workers, one test file per worker at a time (module fixtures stay in one process)
PYTEST_ARGS ?= -n 2 --dist loadfile

.PHONY: install demo test lint typecheck bench-kafka bench-job clean

$(STAMP): pyproject.toml constraints.txt scripts/check-java.sh
	scripts/check-java.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[embedded,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/rewind demo

test: install
	$(BIN)/pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy src

bench-kafka: install
	$(BIN)/python bench/kafka_read.py

bench-job: install
	$(BIN)/python bench/job_run.py

clean:
	rm -rf $(VENV) .rewind .pytest_cache
