"""Database operations, one module per subject; plain functions taking a Session or Database.

Nothing here knows about HTTP: routers, the subscriber and the CLI all call these.
"""
