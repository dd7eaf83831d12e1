"""Alembic's migrations of sandcell's PostgreSQL schemas (run by :mod:`sandcell.db.migrate`)."""
