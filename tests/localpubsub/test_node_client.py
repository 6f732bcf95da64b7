"""The official Node.js client (@google-cloud/pubsub, pinned in tests/localpubsub/node_client) against the emulator.

A second client library finds what the Python one forgives (issue 13). `make test` installs the
packages (`make node-client`); a plain pytest run does `npm ci` itself when they are missing.
Never skipped: without node the test fails and says how to get it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from localpubsub.emulator import EmulatorServer

NODE_CLIENT = Path(__file__).with_name("node_client")

pytestmark = pytest.mark.timeout(420)


def node_modules_ready() -> bool:
    return (NODE_CLIENT / "node_modules" / "@google-cloud" / "pubsub" / "package.json").is_file()


def test_the_official_node_client_against_the_emulator():
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed for the Node.js client test: `make node-client` installs them "
                    "(Debian's nodejs and npm) and the client's packages")
    if not node_modules_ready():
        install = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_CLIENT,
                                 capture_output=True, text=True, timeout=300)
        assert install.returncode == 0 and node_modules_ready(), f"npm ci failed:\n{install.stdout}{install.stderr}"
    with EmulatorServer("localhost", 0) as server:
        # No metadata-server probe: the client would look for GCE credentials it never uses here.
        env = {**os.environ, "PUBSUB_EMULATOR_HOST": server.address, "METADATA_SERVER_DETECTION": "none"}
        result = subprocess.run([node, "run.js"], cwd=NODE_CLIENT, env=env, capture_output=True, text=True,
                                timeout=120)
    print(result.stdout)
    assert result.returncode == 0, f"the Node.js client's checks failed:\n{result.stdout}{result.stderr}"
    assert "# all " in result.stdout and "not ok" not in result.stdout
