"""The one way pytest-ddp's processes prove to each other, over a connection, that they hold a secret
(:mod:`pytest_ddp.common.secret`), for :mod:`pytest_ddp.launched.link` and
:mod:`pytest_ddp.common.mpi_world`, which frame the messages.  What it guarantees:

- A proof is an HMAC-SHA256, under the secret, of a fresh random challenge of :data:`NONCE` bytes
  that the *other* end chose for this connection, of the prover's role and of the fields it states,
  compared in constant time: a proof replayed from another connection, reflected back, or for other
  fields is refused.
- A :class:`Challenge` takes one proof: a second answer to it is refused, right or wrong.
- :func:`own_user` refuses a Unix socket's peer of another user (``SO_PEERCRED``): on one machine,
  holding the secret is not enough.
- A transport reads at most :data:`MAX_UNPROVEN` bytes a message before the proof.

The end that connects always proves itself; the listening end proves itself back where the other
has no other way to know it (launched, across nodes).  An MPI stand-in knows its controller as its
own ancestor of its own user (:mod:`pytest_ddp.rank.mpi_standin`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket

from pytest_ddp.common.procfs import peer_credentials

NONCE = 32  # bytes of a challenge, and of a proof
MAX_UNPROVEN = 4096  # bytes a message may have before its sender has proven itself
# Whose proof: the end that listened, or the one that connected.  One is never the other's.
LISTENER, CONNECTOR = b"pytest-ddp listener", b"pytest-ddp connector"


class HandshakeError(Exception):
    """The other end did not prove itself, or is not one that may."""


def prove(secret: bytes, role: bytes, challenge: bytes, *fields: int) -> bytes:
    """The proof by ``role`` holding ``secret`` that answers ``challenge`` and vouches for ``fields``."""
    if len(challenge) != NONCE:
        raise HandshakeError(f"a challenge of {len(challenge)} bytes, not {NONCE}")
    stated = " ".join(map(str, fields)).encode()
    return hmac.new(secret, role + b"\0" + challenge + stated, hashlib.sha256).digest()


def check(proof: bytes, secret: bytes, role: bytes, challenge: bytes, *fields: int) -> None:
    """HandshakeError unless ``proof`` is :func:`prove`'s for these."""
    if not hmac.compare_digest(proof, prove(secret, role, challenge, *fields)):
        raise HandshakeError("its proof is not made with the secret")


class Challenge:
    """A fresh challenge for one connection, and the check of the one proof that answers it."""

    def __init__(self) -> None:
        self.nonce = secrets.token_bytes(NONCE)
        self.answered = False

    def check(self, proof: bytes, secret: bytes, role: bytes, *fields: int) -> None:
        """HandshakeError unless ``proof`` is :func:`prove`'s and the first answer to this challenge."""
        if self.answered:
            raise HandshakeError("a second answer to one challenge")
        self.answered = True
        check(proof, secret, role, self.nonce, *fields)


def own_user(sock: socket.socket) -> int:
    """The process at the other end of ``sock`` if it runs as our effective uid; else HandshakeError."""
    pid, uid = peer_credentials(sock)
    if uid != os.geteuid():
        raise HandshakeError(f"process {pid} runs as user {uid}")
    return pid
