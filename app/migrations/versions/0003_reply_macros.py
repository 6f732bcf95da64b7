"""The team's reply library, kept by supervisors in the dashboard (table `reply_macros`).

One row per `chatlens.contracts.ReplyMacro`, in the library's order (`position`). The table
starts with the library ChatLens ships (`chatlens.replies.DEFAULT_LIBRARY` as it is when this
revision runs), in file order, marked as nobody's edit (`updated_by` null). Types written out,
as in the baseline: never edit a released revision.

Revision ID: 0003_reply_macros
Revises: 0002_output_confidence
Create Date: 2026-12-01

"""
from datetime import datetime, timezone
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from chatlens.replies import read_library

revision: str = '0003_reply_macros'
down_revision: Union[str, Sequence[str], None] = '0002_output_confidence'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    table = op.create_table('reply_macros',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('title', sa.Text(), nullable=False),
    sa.Column('language', sa.String(length=35), nullable=False),
    sa.Column('keywords', sa.Text(), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.Column('updated_by', sa.String(length=64), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    )
    now = datetime.now(timezone.utc).replace(tzinfo=None)  # stored as naive UTC, as app.models does
    op.bulk_insert(table, [
        {'position': position, 'title': macro.title, 'language': macro.language, 'keywords': macro.keywords,
         'body': macro.body, 'updated_at': now, 'updated_by': None}
        for position, macro in enumerate(read_library().macros, 1)
    ])


def downgrade() -> None:
    op.drop_table('reply_macros')
