"""README.md's configuration reference matches the code (flags from argparse, variables from Settings)."""

from cli import reference


def test_readme_configuration_reference_is_current():
    assert reference.main([]) == 0, "run `make docs`"
    tables = reference.sections()
    for flag in ("--tenant-models", "--model-watch", "--remote-url", "--model-sharing", "--max-outstanding"):
        assert f"`{flag}`" in tables["command:pipeline"]
    assert "`CHATLENS_DATABASE_URL`" in tables["environment"] and "`CHATLENS_CACHE`" in tables["environment"]
    assert "%(default)s" not in "".join(tables.values())
