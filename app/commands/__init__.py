"""`chatlens` subcommands of the dashboard; each keeps FastAPI and SQLAlchemy imports inside run()."""
