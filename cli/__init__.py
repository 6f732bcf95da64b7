"""The `chatlens` command and what drives the whole system (the demo, the README reference).

The top of the import graph: it may import `app`, `pipeline` and `chatlens`, and nothing
imports it, so that `chatlens/` stays the bottom layer every side can depend on.
"""
