"""Extras that ship with the package but are not imported by it (monitoring files)."""
