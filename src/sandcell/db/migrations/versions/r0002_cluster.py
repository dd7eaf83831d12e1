"""What the replicas and nodes of a cluster share beyond the stores: who is alive, the quotas
counted across replicas, the runs in flight and where each session lives.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06

Times are the database's own clock (``now()``), so replicas on machines whose clocks disagree
still count one minute alike.
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

T = 'TEXT COLLATE "C"'

STATEMENTS = (
    "CREATE SCHEMA sandcell_cluster",
    # One row per running replica (`sandcell serve`), refreshed by its heartbeat: a replica
    # whose row is stale is dead, and what it held is swept.
    f"""CREATE TABLE sandcell_cluster.replicas (
        id {T} PRIMARY KEY,
        host {T} NOT NULL,
        pid BIGINT NOT NULL,
        address {T} NOT NULL DEFAULT '',
        started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        seen_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    # Sandboxes each replica holds for each tenant now (max_concurrent counts their sum).
    f"""CREATE TABLE sandcell_cluster.holds (
        replica {T} NOT NULL,
        tenant {T} NOT NULL,
        count BIGINT NOT NULL CHECK (count >= 0),
        PRIMARY KEY (replica, tenant))""",
    # Starts of the last minute (runs_per_minute), pruned as they age.
    f"""CREATE TABLE sandcell_cluster.starts (
        tenant {T} NOT NULL,
        at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    "CREATE INDEX starts_by_tenant ON sandcell_cluster.starts (tenant, at)",
    # Runs a replica has begun and not yet answered: a dead replica's are recorded as lost.
    f"""CREATE TABLE sandcell_cluster.runs_in_flight (
        run_id {T} PRIMARY KEY,
        tenant {T} NOT NULL,
        replica {T} NOT NULL,
        node {T},
        code {T} NOT NULL DEFAULT '',
        language {T} NOT NULL DEFAULT '',
        started_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    "CREATE INDEX runs_in_flight_by_replica ON sandcell_cluster.runs_in_flight (replica)",
    # The session directory: which node holds each live session, and its E2B sandbox id.
    f"""CREATE TABLE sandcell_cluster.sessions (
        session_id {T} PRIMARY KEY,
        tenant {T} NOT NULL,
        node {T} NOT NULL,
        replica {T} NOT NULL,
        e2b_id {T} UNIQUE,
        profile {T} NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    "CREATE INDEX sessions_by_node ON sandcell_cluster.sessions (node)",
    # MCP connections (streamable HTTP): each Mcp-Session-Id lives in the replica that
    # answered its initialize, where the other replicas forward its requests.
    f"""CREATE TABLE sandcell_cluster.mcp_sessions (
        mcp_session_id {T} PRIMARY KEY,
        replica {T} NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    "CREATE INDEX mcp_sessions_by_replica ON sandcell_cluster.mcp_sessions (replica)",
)


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP SCHEMA sandcell_cluster CASCADE")
