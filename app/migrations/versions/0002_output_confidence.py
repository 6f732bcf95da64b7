"""The model's confidence in each summary and reply draft (issue 31).

`ChatAnalysis.summary_confidence` and `reply_confidence` (chatlens/contracts.py): nullable, so
every stored window keeps its row and reads as "not measured". Types written out, as in the
baseline: never edit a released revision.

Revision ID: 0002_output_confidence
Revises: 0001_baseline
Create Date: 2026-11-27

"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = '0002_output_confidence'
down_revision: Union[str, Sequence[str], None] = '0001_baseline'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    with op.batch_alter_table('insights') as batch:
        batch.add_column(sa.Column('summary_confidence', sa.Float(), nullable=True))
        batch.add_column(sa.Column('reply_confidence', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('insights') as batch:
        batch.drop_column('reply_confidence')
        batch.drop_column('summary_confidence')
