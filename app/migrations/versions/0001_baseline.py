"""Baseline: the dashboard schema as `Base.metadata.create_all` made it before migrations.

A database made by that release has these tables but no alembic_version: app.db runs this
revision on it too. Every table and index is created IF NOT EXISTS, so the run adds only what
such a database lacks and leaves its tables and rows as they are; its schema then is this
revision's, whatever the models have become since. Types are written out (no app.models
import), so this revision stays what it is when the models change: never edit it.

Revision ID: 0001_baseline
Revises:
Create Date: 2026-11-24

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = '0001_baseline'
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Create every table, index and constraint of the dashboard that is not there yet."""
    op.create_table('app_secrets',
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('value', sa.String(length=255), nullable=False),
    sa.PrimaryKeyConstraint('name'),
    if_not_exists=True,
    )
    op.create_table('audit_log',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.Column('actor', sa.String(length=64), nullable=False),
    sa.Column('action', sa.String(length=32), nullable=False),
    sa.Column('chat_id', sa.String(length=128), nullable=True),
    sa.Column('window_id', sa.String(length=128), nullable=True),
    sa.Column('before', sa.JSON(), nullable=True),
    sa.Column('after', sa.JSON(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    if_not_exists=True,
    )
    op.create_index(op.f('ix_audit_log_action'), 'audit_log', ['action'], unique=False, if_not_exists=True)
    op.create_index(op.f('ix_audit_log_actor'), 'audit_log', ['actor'], unique=False, if_not_exists=True)
    op.create_index(op.f('ix_audit_log_at'), 'audit_log', ['at'], unique=False, if_not_exists=True)
    op.create_index(op.f('ix_audit_log_chat_id'), 'audit_log', ['chat_id'], unique=False, if_not_exists=True)

    op.create_table('chats',
    sa.Column('chat_id', sa.String(length=128), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=True),
    sa.Column('customer_id', sa.String(length=128), nullable=False),
    sa.Column('language', sa.String(length=35), nullable=True),
    sa.Column('closed', sa.Boolean(), nullable=False),
    sa.Column('window_id', sa.String(length=128), nullable=False),
    sa.Column('window_last_message_at', sa.DateTime(), nullable=False),
    sa.Column('window_analyzed_at', sa.DateTime(), nullable=False),
    sa.Column('windows_seen', sa.Integer(), nullable=False),
    sa.Column('sentiment', sa.Integer(), nullable=False),
    sa.Column('confidence', sa.Float(), nullable=False),
    sa.Column('corrected_sentiment', sa.Integer(), nullable=True),
    sa.Column('effective_sentiment', sa.Integer(), nullable=False),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('draft', sa.Text(), nullable=True),
    sa.Column('draft_edited', sa.Boolean(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('reject_reason', sa.Text(), nullable=True),
    sa.Column('assignee', sa.String(length=64), nullable=True),
    sa.Column('waiting_since', sa.DateTime(), nullable=False),
    sa.Column('first_seen_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.Column('updated_by', sa.String(length=64), nullable=True),
    sa.Column('search_text', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('chat_id'),
    if_not_exists=True,
    )
    op.create_index(op.f('ix_chats_assignee'), 'chats', ['assignee'], unique=False, if_not_exists=True)
    op.create_index(op.f('ix_chats_effective_sentiment'), 'chats', ['effective_sentiment'], unique=False, if_not_exists=True)
    op.create_index('ix_chats_order', 'chats', ['effective_sentiment', 'waiting_since', 'chat_id', 'status'], unique=False, if_not_exists=True)
    op.create_index('ix_chats_queue', 'chats', ['status', 'effective_sentiment', 'waiting_since'], unique=False, if_not_exists=True)
    op.create_index(op.f('ix_chats_status'), 'chats', ['status'], unique=False, if_not_exists=True)
    op.create_index(op.f('ix_chats_tenant'), 'chats', ['tenant'], unique=False, if_not_exists=True)
    op.create_index(op.f('ix_chats_waiting_since'), 'chats', ['waiting_since'], unique=False, if_not_exists=True)

    op.create_table('error_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('source', sa.String(length=32), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('message_id', sa.String(length=128), nullable=True),
    sa.Column('stage', sa.String(length=64), nullable=True),
    sa.Column('error_class', sa.String(length=200), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=False),
    sa.Column('chat_id', sa.String(length=200), nullable=True),
    sa.Column('payload', sa.LargeBinary(), nullable=False),
    sa.Column('attributes', sa.JSON(), nullable=False),
    sa.Column('failed_at', sa.DateTime(), nullable=True),
    sa.Column('received_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('source', 'message_id', name='uq_error_events_message'),
    if_not_exists=True,
    )
    op.create_index(op.f('ix_error_events_chat_id'), 'error_events', ['chat_id'], unique=False, if_not_exists=True)
    op.create_index(op.f('ix_error_events_kind'), 'error_events', ['kind'], unique=False, if_not_exists=True)
    op.create_index(op.f('ix_error_events_received_at'), 'error_events', ['received_at'], unique=False, if_not_exists=True)

    op.create_table('events',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('chat_id', sa.String(length=128), nullable=True),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sqlite_autoincrement=True,
    if_not_exists=True,
    )
    op.create_table('feedback',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('chat_id', sa.String(length=128), nullable=False),
    sa.Column('window_id', sa.String(length=128), nullable=False),
    sa.Column('predicted', sa.Integer(), nullable=False),
    sa.Column('corrected', sa.Integer(), nullable=False),
    sa.Column('actor', sa.String(length=64), nullable=False),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    if_not_exists=True,
    )
    op.create_index(op.f('ix_feedback_chat_id'), 'feedback', ['chat_id'], unique=False, if_not_exists=True)

    op.create_table('insights',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('chat_id', sa.String(length=128), nullable=False),
    sa.Column('window_id', sa.String(length=128), nullable=False),
    sa.Column('message_id', sa.String(length=128), nullable=True),
    sa.Column('sentiment', sa.Integer(), nullable=False),
    sa.Column('confidence', sa.Float(), nullable=False),
    sa.Column('scores', sa.JSON(), nullable=False),
    sa.Column('summary', sa.Text(), nullable=False),
    sa.Column('reply_draft', sa.Text(), nullable=True),
    sa.Column('flags', sa.JSON(), nullable=False),
    sa.Column('model_id', sa.String(length=200), nullable=False),
    sa.Column('prompt_version', sa.String(length=64), nullable=False),
    sa.Column('published_at', sa.DateTime(), nullable=False),
    sa.Column('analyzed_at', sa.DateTime(), nullable=False),
    sa.Column('received_at', sa.DateTime(), nullable=False),
    sa.Column('last_message_at', sa.DateTime(), nullable=False),
    sa.Column('transcript', sa.JSON(), nullable=False),
    sa.Column('payload', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('chat_id', 'window_id', name='uq_insights_chat_window'),
    if_not_exists=True,
    )
    op.create_index(op.f('ix_insights_chat_id'), 'insights', ['chat_id'], unique=False, if_not_exists=True)

    op.create_table('login_throttle',
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('failures', sa.Integer(), nullable=False),
    sa.Column('first_failure_at', sa.DateTime(), nullable=False),
    sa.Column('locked_until', sa.DateTime(), nullable=True),
    sa.PrimaryKeyConstraint('key'),
    if_not_exists=True,
    )
    op.create_table('users',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('username', sa.String(length=64), nullable=False),
    sa.Column('password_hash', sa.String(length=255), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('disabled', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('last_login_at', sa.DateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('username'),
    if_not_exists=True,
    )
    op.create_table('sessions',
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('csrf_token', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('expires_at', sa.DateTime(), nullable=False),
    sa.Column('ip', sa.String(length=64), nullable=True),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('token_hash'),
    if_not_exists=True,
    )
    op.create_index(op.f('ix_sessions_expires_at'), 'sessions', ['expires_at'], unique=False, if_not_exists=True)
    op.create_index(op.f('ix_sessions_user_id'), 'sessions', ['user_id'], unique=False, if_not_exists=True)



def downgrade() -> None:
    """Drop them all (the FTS5 table is app.db's, not a migration's)."""
    op.drop_index(op.f('ix_sessions_user_id'), table_name='sessions')
    op.drop_index(op.f('ix_sessions_expires_at'), table_name='sessions')

    op.drop_table('sessions')
    op.drop_table('users')
    op.drop_table('login_throttle')
    op.drop_index(op.f('ix_insights_chat_id'), table_name='insights')

    op.drop_table('insights')
    op.drop_index(op.f('ix_feedback_chat_id'), table_name='feedback')

    op.drop_table('feedback')
    op.drop_table('events')
    op.drop_index(op.f('ix_error_events_received_at'), table_name='error_events')
    op.drop_index(op.f('ix_error_events_kind'), table_name='error_events')
    op.drop_index(op.f('ix_error_events_chat_id'), table_name='error_events')

    op.drop_table('error_events')
    op.drop_index(op.f('ix_chats_waiting_since'), table_name='chats')
    op.drop_index(op.f('ix_chats_tenant'), table_name='chats')
    op.drop_index(op.f('ix_chats_status'), table_name='chats')
    op.drop_index('ix_chats_queue', table_name='chats')
    op.drop_index('ix_chats_order', table_name='chats')
    op.drop_index(op.f('ix_chats_effective_sentiment'), table_name='chats')
    op.drop_index(op.f('ix_chats_assignee'), table_name='chats')

    op.drop_table('chats')
    op.drop_index(op.f('ix_audit_log_chat_id'), table_name='audit_log')
    op.drop_index(op.f('ix_audit_log_at'), table_name='audit_log')
    op.drop_index(op.f('ix_audit_log_actor'), table_name='audit_log')
    op.drop_index(op.f('ix_audit_log_action'), table_name='audit_log')

    op.drop_table('audit_log')
    op.drop_table('app_secrets')
