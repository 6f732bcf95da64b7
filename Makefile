# The two commands: `make demo` and `make test`. Both create .venv when it is
# missing and refresh it when pyproject.toml or constraints.txt changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test test-fast demo lock schemas bench clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=25"
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not browser"

demo: $(STAMP)
	$(BIN)/chatlens demo

schemas: $(STAMP)
	$(BIN)/chatlens schemas --write

# Re-resolve every dependency from pyproject.toml and pin the result.
lock:
	rm -rf /tmp/chatlens-lock && $(PYTHON) -m venv /tmp/chatlens-lock
	/tmp/chatlens-lock/bin/pip install -q -e '.[dev]'
	/tmp/chatlens-lock/bin/pip freeze --exclude-editable | grep -v '^chatlens' > constraints.txt

clean:
	rm -rf $(VENV) build *.egg-info
