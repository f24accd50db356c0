"""Adapters that put haltwise inside agent frameworks (CONTRACT.md, "Framework integrations").

Each module is an optional extra, importable only with its framework installed, and uses the
public ``haltwise`` API only.
"""
