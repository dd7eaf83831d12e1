"""Where sandcell's shared state lives: SQLite files under the home, or one PostgreSQL database.

By default every store (the audit log, approvals, tenants and their quotas, the agent's paused
conversations, change approvals) is a private SQLite file under the home (:mod:`sandcell._sqlite`):
the embedded choice for one machine. With ``$SANDCELL_DATABASE_URL=postgresql://...`` set, every
store lives in that database instead, one PostgreSQL schema per store, so that several replicas
of the service and every node of a cluster share one record, one set of tenants and one quota
count (:mod:`sandcell.db.postgres`). The schema there is kept by Alembic migrations
(:mod:`sandcell.db.migrate`).
"""

from sandcell.db.url import DATABASE_URL_ENV, database_url, redacted

__all__ = ["DATABASE_URL_ENV", "database_url", "redacted"]
