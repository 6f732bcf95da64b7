"""bench/helpers.py's machine description: what a figure was measured on."""

from __future__ import annotations

from bench.helpers import describe, machine

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni avx512_bf16

processor\t: 1
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni avx512_bf16
"""


def test_a_machine_names_its_cpu_and_the_vector_extensions_it_has(tmp_path):
    (tmp_path / "cpuinfo").write_text(ZEN4)
    (tmp_path / "meminfo").write_text("MemTotal:       24558900 kB\nMemFree:        1000 kB\n")
    found = machine(tmp_path / "cpuinfo", tmp_path / "meminfo")
    assert found["cpu"] == "AMD EPYC 9R14 96-Core Processor"
    assert found["features"] == ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"]  # no AMX here
    assert found["memory_gib"] == 23.4
    assert describe(found).endswith("cores, avx2 fma avx512f avx512_vnni avx512_bf16, 23.4 GiB")


def test_a_machine_without_proc_still_says_what_it_is(tmp_path):
    found = machine(tmp_path / "none", tmp_path / "none")
    assert found["cpu"] and found["features"] == [] and found["memory_gib"] is None
    assert "no listed vector extensions" in describe(found)
