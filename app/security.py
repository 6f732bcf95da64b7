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

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher()
# Verified when the username is unknown, so a wrong name costs as long as a wrong password.
_DUMMY_HASH = _hasher.hash("chatlens-dummy-password")

MIN_PASSWORD_CHARS = 8
# Each argon2 verification takes 64 MiB: a burst of logins waits here instead of exhausting memory.
MAX_CONCURRENT_VERIFICATIONS = 4
_verifications = threading.BoundedSemaphore(MAX_CONCURRENT_VERIFICATIONS)


def hash_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_CHARS:
        raise ValueError(f"a password needs at least {MIN_PASSWORD_CHARS} characters")
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
