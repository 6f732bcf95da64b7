"""The first run's noise filters drop exactly the lines nobody can act on."""

from __future__ import annotations

import logging
import subprocess
import sys

from chatlens.quiet import NotActionable


def test_log_filter_drops_known_notes_and_keeps_real_warnings():
    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("apache_beam.io.filesystems", logging.WARNING, __file__, 1, message, None, None)

    keep = NotActionable().filter
    assert not keep(record("Failed to import GCSFileSystem; loading of this filesystem will be skipped."))
    assert not keep(record("Background thread did not exit."))
    assert keep(record("Failed to publish 3 insights: DEADLINE_EXCEEDED"))


def test_native_stderr_filter_hides_cuda_probing_and_passes_everything_else():
    """A child writes to fd 2 as TensorFlow does: the noise goes, the real error stays, in order."""
    code = (
        "import os, sys\n"
        "from chatlens.quiet import gpu_present, native_noise_filtered\n"
        "with native_noise_filtered():\n"
        "    os.write(2, b'E0000 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)\\n')\n"
        "    os.write(2, b'normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty.\\n')\n"
        "    os.write(2, b'I0000 port.cc:153] oneDNN custom operations are on. You may see slightly different\\n')\n"
        "    os.write(2, b'F0000 a real native failure\\n')\n"
        "    print('python warning', file=sys.stderr)\n"
        "os.write(2, b'after: failed call to cuInit stays visible outside the filter\\n')\n"
        "print('gpu' if gpu_present() else 'cpu')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "precompiled_charsmap" not in err and "oneDNN" not in err
    assert ("cuda_platform.cc" in err) == (done.stdout.decode().strip() == "gpu")
    assert err.index("a real native failure") < err.index("python warning") < err.index("after:")
