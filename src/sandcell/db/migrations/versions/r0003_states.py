"""Saved session states' metadata (paused sessions, snapshots, fork points): one row per state,
holding its signed manifest; the state's bytes stay in the shared directory.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-06

The columns beside ``manifest`` are what listings filter and order on (owner, kind, snapshot
name, expiry); the manifest, signed with the key in the shared directory, stays the authority
(:mod:`sandcell.sessions.state_index`): a row whose columns and manifest disagree is read by
its manifest. ``claim`` is set by the one resume that took a paused state (a random token),
``claimed_at`` on the database's clock, so an abandoned claim is given back by age.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

T = 'TEXT COLLATE "C"'

STATEMENTS = (
    "CREATE SCHEMA sandcell_states",
    f"""CREATE TABLE sandcell_states.states (
        id {T} PRIMARY KEY,
        kind {T} NOT NULL CHECK (kind IN ('paused', 'snapshot', 'fork')),
        name {T},
        owner {T},
        session_id {T} NOT NULL,
        manifest TEXT NOT NULL,
        stored_bytes BIGINT NOT NULL CHECK (stored_bytes >= 0),
        created_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ,
        claim {T},
        claimed_at TIMESTAMPTZ)""",
    "CREATE INDEX states_by_owner ON sandcell_states.states (owner, kind, created_at)",
    "CREATE INDEX states_expiring ON sandcell_states.states (expires_at) "
    "WHERE expires_at IS NOT NULL",
    "CREATE INDEX states_claimed ON sandcell_states.states (claimed_at) WHERE claim IS NOT NULL",
)


def upgrade() -> None:
    for statement in STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP SCHEMA sandcell_states CASCADE")
