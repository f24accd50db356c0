"""``haltwise serve``: the HTTP API and the live dashboard.

See CONTRACT.md, "HTTP API and dashboard".
"""
