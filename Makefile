# The two commands: `make demo` and `make test`. Both create .venv when it is
# missing and refresh it when pyproject.toml or constraints.txt changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test test-fast demo lock schemas docs bench clean browser postgres node-client

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=25"
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

# Two workers, a test module each at a time: most tests wait on a server, a browser or a
# subprocess while the other worker's model tests use the CPU (TEST_WORKERS=0: one process).
TEST_WORKERS ?= 2

test: $(STAMP) browser postgres node-client
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# The browser tests drive Debian's Chromium (Playwright never downloads a browser here).
browser:
	@test -x /usr/bin/chromium || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium >/dev/null; }

# The PostgreSQL variants run on a throwaway server from Debian's package (tests/support/postgres.py).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq postgresql >/dev/null; }

# The official Node.js Pub/Sub client, pinned by tests/localpubsub/node_client/package-lock.json, checks the
# emulator (tests/localpubsub/test_node_client.py); Debian's nodejs and npm when node is missing.
NODE_CLIENT := tests/localpubsub/node_client
node-client: $(NODE_CLIENT)/node_modules/.installed

$(NODE_CLIENT)/node_modules/.installed: $(NODE_CLIENT)/package-lock.json
	@command -v node >/dev/null && command -v npm >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq nodejs npm >/dev/null; }
	cd $(NODE_CLIENT) && npm ci --no-audit --no-fund
	@touch $@

test-fast: $(STAMP) postgres node-client
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow and not browser"

demo: $(STAMP)
	$(BIN)/chatlens demo

schemas: $(STAMP)
	$(BIN)/chatlens schemas --write

# Regenerate README.md's configuration reference from the code.
docs: $(STAMP)
	$(BIN)/python -m cli.reference --write

# Re-resolve every dependency from pyproject.toml and pin the result.
lock:
	rm -rf /tmp/chatlens-lock && $(PYTHON) -m venv /tmp/chatlens-lock
	/tmp/chatlens-lock/bin/pip install -q -e '.[dev]'
	/tmp/chatlens-lock/bin/pip freeze --exclude-editable | grep -v '^chatlens' > constraints.txt

clean:
	rm -rf $(VENV) build *.egg-info
