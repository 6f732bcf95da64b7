"""Resource-name checks and the error type shared by the emulator's modules.

Kept apart from the broker so that validation reads like the service's rules and
the broker stays about message flow.
"""

from __future__ import annotations

import re

import grpc

# Pub/Sub resource ids: 3-255 chars, start with a letter, must not start with "goog".
_RESOURCE_ID = re.compile(r"[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}")
_RULES = "see https://cloud.google.com/pubsub/docs/pubsub-basics#resource_names"


class EmulatorError(Exception):
    """A failed request, carrying the gRPC status code the real service would send."""

    def __init__(self, code: grpc.StatusCode, message: str, details: list | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or []  # google.rpc detail messages (ErrorInfo, ...) sent with the status


def invalid(message: str) -> EmulatorError:
    return EmulatorError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(kind: str, name: str) -> EmulatorError:
    return EmulatorError(grpc.StatusCode.NOT_FOUND, f"{kind} not found (resource={name})")


def unimplemented(what: str) -> EmulatorError:
    return EmulatorError(grpc.StatusCode.UNIMPLEMENTED, f"{what} is not supported by the ChatLens emulator")


def check_project(name: str) -> str:
    """Validate `projects/{project}` and return the project id."""
    parts = name.split("/")
    if len(parts) != 2 or parts[0] != "projects" or not parts[1]:
        raise invalid(f"Invalid project name (name={name!r}); expected projects/{{project}}")
    return parts[1]


def check_resource(name: str, collection: str) -> str:
    """Validate `projects/{project}/{collection}/{id}` and return the project id.

    `collection` is "topics" or "subscriptions"; the id rules are the service's.
    """
    kind = collection[:-1]
    if not name:
        raise invalid(f"The {kind} name must not be empty")
    parts = name.split("/")
    valid = (
        len(parts) == 4
        and parts[0] == "projects"
        and bool(parts[1])
        and parts[2] == collection
        and _RESOURCE_ID.fullmatch(parts[3]) is not None
        and not parts[3].lower().startswith("goog")
    )
    if not valid:
        raise invalid(f"Invalid {kind} name (name={name!r}); expected projects/{{project}}/{collection}/{{id}}, {_RULES}")
    return parts[1]


def project_of(name: str) -> str:
    """The project id of a name already validated by `check_resource`."""
    return name.split("/")[1]
