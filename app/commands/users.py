"""Manage dashboard staff accounts: add, list, disable, enable.

  chatlens users add alice --role supervisor        (asks for the password twice)
  printf '%s\n' "$PW" | chatlens users add bob --password-stdin
  chatlens users list
  chatlens users disable bob                        (also ends bob's sessions)
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help="SQLAlchemy URL (default: CHATLENS_DATABASE_URL or the dashboard's)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="create an account")
    add.add_argument("username")
    add.add_argument("--role", choices=("agent", "supervisor"), default="agent")
    add.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    actions.add_parser("list", help="list accounts")
    for name, text in (("disable", "disable an account and end its sessions"), ("enable", "enable an account again")):
        action = actions.add_parser(name, help=text)
        action.add_argument("username")


def _password(from_stdin: bool) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    import getpass

    first = getpass.getpass("Password: ")
    if getpass.getpass("Repeat password: ") != first:
        raise ValueError("the passwords differ")
    return first


def run(args: argparse.Namespace) -> int:
    from app.crud import users
    from app.db import Database
    from app.errors import DashboardError
    from app.settings import DashboardSettings

    url = args.database_url or DashboardSettings().database_url
    db = Database(url, search_backend="like")
    try:
        db.upgrade()
        if args.action == "add":
            user = users.create_user(db, args.username, _password(args.password_stdin), args.role)
            print(f"added {user.username} ({user.role})")
        elif args.action == "list":
            rows = users.list_users(db)
            print(f"{'USERNAME':<24} {'ROLE':<11} {'STATE':<9} LAST LOGIN")
            for user in rows:
                last = user.last_login_at.strftime("%Y-%m-%d %H:%M UTC") if user.last_login_at else "never"
                print(f"{user.username:<24} {user.role:<11} {'disabled' if user.disabled else 'active':<9} {last}")
        else:
            user = users.set_disabled(db, args.username, disabled=args.action == "disable")
            print(f"{user.username} is now {'disabled' if user.disabled else 'active'}")
    except (DashboardError, ValueError) as error:
        print(f"chatlens users: {error}", file=sys.stderr)
        return 1
    finally:
        db.dispose()
    return 0
