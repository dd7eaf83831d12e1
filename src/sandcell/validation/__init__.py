"""Validation of what comes out of a run: declared result, invariants, leak scan, terminal safety."""
