"""Serialize a SentencePiece `ModelProto` without `sentencepiece_model_pb2`.

The generated module shipped with sentencepiece was built by protoc 7 and refuses
to import under the protobuf 6 runtime we pin. The message schema itself is fine:
its serialized file descriptor is a bytes literal inside that module, so we read
it from the source (without executing the module), load it into a private
descriptor pool and let protobuf build the message classes from it. The field
numbers are therefore exactly those of the sentencepiece release installed.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache
from pathlib import Path

from google.protobuf import descriptor_pool, message_factory

_PB2_MODULE = "sentencepiece.sentencepiece_model_pb2"


class PieceType(IntEnum):
    """`ModelProto.SentencePiece.Type`; GGUF's `token_type` uses the same numbers."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


@dataclass(frozen=True)
class SpecialIds:
    bos: int
    eos: int
    pad: int
    unk: int


def _serialized_descriptor() -> bytes:
    """The `AddSerializedFile(b'...')` argument of sentencepiece_model_pb2.py."""
    spec = importlib.util.find_spec(_PB2_MODULE)
    if spec is None or spec.origin is None:
        raise ImportError(f"{_PB2_MODULE} not found; is sentencepiece installed?")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, bytes)
        ):
            return node.args[0].value
    raise ImportError(f"no serialized descriptor found in {spec.origin}")


@lru_cache(maxsize=1)
def model_proto_class() -> type:
    """The `sentencepiece.ModelProto` message class, from a private pool."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(_serialized_descriptor())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("sentencepiece.ModelProto"))


def build_bpe_model(
    pieces: Sequence[str],
    scores: Sequence[float],
    types: Sequence[PieceType | int],
    special: SpecialIds,
) -> bytes:
    """A byte-fallback BPE model with Gemma's normalizer (raw text, spaces as '▁')."""
    proto = model_proto_class()()
    for piece, score, kind in zip(pieces, scores, types, strict=True):
        proto.pieces.add(piece=piece, score=float(score), type=int(kind))

    trainer = proto.trainer_spec
    trainer.model_type = trainer.BPE
    trainer.vocab_size = len(pieces)
    trainer.split_digits = True
    trainer.byte_fallback = True
    trainer.allow_whitespace_only_pieces = True
    trainer.unk_id = special.unk
    trainer.bos_id = special.bos
    trainer.eos_id = special.eos
    trainer.pad_id = special.pad
    trainer.unk_piece = pieces[special.unk]
    trainer.bos_piece = pieces[special.bos]
    trainer.eos_piece = pieces[special.eos]
    trainer.pad_piece = pieces[special.pad]

    normalizer = proto.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = False
    normalizer.remove_extra_whitespaces = False
    normalizer.escape_whitespaces = True
    return proto.SerializeToString()
