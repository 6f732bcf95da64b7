"""Send stored dead letters back through the pipeline once their cause is fixed.

  chatlens replay                      (what would be replayed: stages inference, reply, postprocess)
  chatlens replay --yes                (publish them)
  chatlens replay --stage inference --since-id 120 --yes

Reads the dead letters the dashboard stored (its errors view), and publishes each one's
original payload and attributes to the input topic it belongs to: a valid ChatWindow to
the windows topic, a valid ChatMessage to the messages topic. Letters of stage
`validate` are left alone by default: their payload breaks the contract, and sending it
again would only dead-letter it again (fix the sender). Nothing is deleted; every replay
is written to the audit log (action `replay`, with the dead letter's id and the new
message id), and a letter already replayed is skipped unless `--again` is given. The
replayed message carries the attribute `replayed_from=<dead letter id>`.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_STAGES = ("inference", "reply", "postprocess")
ACTION = "replay"
ACTOR = "chatlens replay"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help="SQLAlchemy URL (default: CHATLENS_DATABASE_URL or the dashboard's)")
    parser.add_argument("--project", help="Google Cloud project of the input topics (default: CHATLENS_PROJECT)")
    parser.add_argument("--stage", action="append", metavar="STAGE",
                        help=f"only dead letters of this stage, repeatable (default: {', '.join(DEFAULT_STAGES)})")
    parser.add_argument("--since-id", type=int, default=0, metavar="ID", help="only dead letters with a larger id")
    parser.add_argument("--limit", type=int, default=1000, help="most dead letters per run (default 1000)")
    parser.add_argument("--again", action="store_true", help="also replay letters that were replayed before")
    parser.add_argument("--yes", action="store_true", help="publish (default: only list what would be replayed)")


def plan(session, stages, since_id: int, limit: int, again: bool) -> list[tuple[object, str | None, str]]:
    """(dead letter row, input topic id or None, why) for each candidate, oldest first."""
    from sqlalchemy import select

    from app.crud.errors import DEAD_LETTER
    from app.models import AuditEntry, ErrorEvent
    from chatlens.config import LAYOUT
    from chatlens.contracts import ContractError, parse_message, parse_window

    rows = session.scalars(
        select(ErrorEvent).where(ErrorEvent.kind == DEAD_LETTER, ErrorEvent.stage.in_(stages),
                                 ErrorEvent.id > since_id).order_by(ErrorEvent.id).limit(limit))
    replayed = set() if again else {
        entry.before.get("dead_letter_id") for entry in session.scalars(
            select(AuditEntry).where(AuditEntry.action == ACTION)) if entry.before}
    planned = []
    for row in rows:
        if row.id in replayed:
            continue
        try:
            parse_window(row.payload)
            planned.append((row, LAYOUT.windows_topic, "ChatWindow"))
            continue
        except ContractError:
            pass
        try:
            parse_message(row.payload)
            planned.append((row, LAYOUT.messages_topic, "ChatMessage"))
        except ContractError as error:
            planned.append((row, None, f"not a valid input ({str(error)[:80]}); left alone"))
    return planned


def run(args: argparse.Namespace) -> int:
    from app.crud import audit
    from app.db import Database
    from app.settings import DashboardSettings
    from chatlens.config import get_settings, topic_path

    settings = DashboardSettings()
    db = Database(args.database_url or settings.database_url, search_backend="like")
    project = args.project or get_settings().project
    stages = tuple(args.stage or DEFAULT_STAGES)
    publisher = None
    sent = skipped = 0
    try:
        db.upgrade()
        with db.writing() as session:
            planned = plan(session, stages, args.since_id, args.limit, args.again)
            for row, topic, what in planned:
                line = f"#{row.id} {row.stage:<11} chat={row.chat_id or '-'} {row.error_class}: {what}"
                if topic is None or not args.yes:
                    skipped += topic is None
                    print(("skip   " if topic is None else "would  ") + line + (f" -> {topic}" if topic else ""))
                    continue
                if publisher is None:
                    from google.cloud import pubsub_v1

                    publisher = pubsub_v1.PublisherClient()
                original = {k: v for k, v in (row.attributes or {}).items() if not k.startswith("pubsub.")}
                attributes = {**original, "replayed_from": str(row.id)}  # not the dead-letter topic's own
                message_id = publisher.publish(topic_path(project, topic), row.payload, **attributes).result(60)
                audit.record(session, ACTOR, ACTION, chat_id=row.chat_id,
                             before={"dead_letter_id": row.id, "stage": row.stage},
                             after={"topic": topic, "message_id": message_id})
                session.commit()  # one by one: a failure later never forgets what was sent
                sent += 1
                print(f"sent   {line} -> {topic} ({message_id})")
    except Exception as error:  # noqa: BLE001 - the command's one error line
        print(f"chatlens replay: {error}", file=sys.stderr)
        return 1
    finally:
        if publisher is not None:
            publisher.transport.close()
        db.dispose()
    waiting = len(planned) - skipped - sent
    print(f"{sent} replayed, {waiting} to replay (add --yes)" if not args.yes else f"{sent} replayed, "
          f"{skipped} left alone", file=sys.stderr)
    return 0
