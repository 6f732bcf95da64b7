"""Passwords, tokens and signatures: the few primitives the auth code is built from.

Passwords are hashed with argon2id (argon2-cffi defaults). Session and CSRF tokens are
random; the database keeps only an HMAC of a session token, so a leaked table cannot be
replayed as cookies.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections.abc import Iterable

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher()
# Verified when the username is unknown, so a wrong name costs as long as a wrong password.
_DUMMY_HASH = _hasher.hash("chatlens-dummy-password")

# One length rule: a new password needs MIN_PASSWORD_CHARS, and none is longer than login accepts.
MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024
MIN_PASSWORD_SCORE = 3  # zxcvbn's 0-4: 3 is "safely unguessable", about 10^8 guesses or more
ZXCVBN_CHARS = 72  # zxcvbn's own limit: the estimate looks at the first 72 characters
# Each argon2 verification takes 64 MiB: a burst of logins waits here instead of exhausting memory.
MAX_CONCURRENT_VERIFICATIONS = 4
_verifications = threading.BoundedSemaphore(MAX_CONCURRENT_VERIFICATIONS)


def check_new_password(password: str, user_inputs: Iterable[str] = ()) -> None:
    """Raise ValueError, with a sentence to show the person choosing it, unless `password` is long
    enough, not too long to log in with, not a common password and hard to guess (zxcvbn, which
    also knows `user_inputs` such as the username)."""
    if len(password) < MIN_PASSWORD_CHARS:
        raise ValueError(f"a password needs at least {MIN_PASSWORD_CHARS} characters")
    if len(password) > MAX_PASSWORD_CHARS:
        raise ValueError(f"a password has at most {MAX_PASSWORD_CHARS} characters (login accepts no more)")
    from zxcvbn import zxcvbn  # imported here, where passwords are set: its word lists take a moment
    from zxcvbn.matching import RANKED_DICTIONARIES

    if password.strip().lower() in RANKED_DICTIONARIES["passwords"]:
        raise ValueError("that is one of the most common passwords: choose another")
    estimate = zxcvbn(password[:ZXCVBN_CHARS], user_inputs=[value for value in user_inputs if value])
    if estimate["score"] < MIN_PASSWORD_SCORE:
        feedback = estimate["feedback"]
        advice = " ".join(part for part in [feedback.get("warning") or "", *feedback.get("suggestions", [])] if part)
        raise ValueError("that password is too easy to guess" + (f": {advice}" if advice else "")
                         + " A few unrelated words make a strong one.")


def hash_password(password: str) -> str:
    """The argon2 hash; rules for new passwords are `check_new_password`'s (a rehash at login
    must not refuse a password set under older rules)."""
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    try:
        with _verifications:
            return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


def needs_rehash(password_hash: str) -> bool:
    return _hasher.check_needs_rehash(password_hash)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def keyed_hash(secret: str, value: str) -> str:
    return hmac.new(secret.encode(), value.encode(), hashlib.sha256).hexdigest()


def sign(secret: str, value: str) -> str:
    """`value.signature`: for the pre-login CSRF cookie, which has no server-side row."""
    return f"{value}.{keyed_hash(secret, 'sign:' + value)}"


def unsign(secret: str, signed: str | None) -> str | None:
    if not signed or "." not in signed:
        return None
    value, signature = signed.rsplit(".", 1)
    return value if hmac.compare_digest(signature, keyed_hash(secret, "sign:" + value)) else None


def same(a: str | None, b: str | None) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())  # type: ignore[union-attr]
