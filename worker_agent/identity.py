"""The agent's side of identity on the wire (``federation.signing``).

Every Report, heartbeat and will message leaves sealed with the agent's private key; the
dispatcher knows the cluster by the public half. A Command is carried out only when it is sealed by
one of ``dispatcher_public_keys``, within the clock window, not seen before, and, Deletes excepted,
not sealed before this process's first link came up (less ``clock_skew_seconds``): a replay recorded
earlier is refused even after the agent restarted and forgot what it had seen. Nothing is lost by that
rule: the dispatcher answers every link's Inventory with a fresh Resync and re-sends the Places the
agent lacks. Commands sealed later are judged by the opener's memory of what this process saw, which
spans its links: one queued in the broker while a partition cut the link applies when the link is
back (refused, it went unanswered and the dispatcher moved its Job, attempt after attempt), while
one this process already carried out is a ``replay``. A Delete applies whenever it was sealed (see
``_is_delete``). A Place arrives encrypted to this agent's key (``federation.sealing``) and is
decrypted only after its seal checked out; one that does not decrypt is refused (``bad_ciphertext``,
``not_for_us``) and counted like any other refusal. A message may carry several Commands
(``federation.messages.COMMANDS_PREFIX``), signed once: each item is judged as above and applied in order.
"""

from __future__ import annotations

import logging

from federation.errors import Invalid
from federation.messages import MessageRefused, decode_command, split_commands
from federation.refusals import refused
from federation.sealing import PlaceOpener, is_sealed
from federation.signing import Opener, Refused, Sealer, load_private_key, parse_public_key
from worker_agent.settings import AgentSettings

log = logging.getLogger(__name__)


class AgentIdentity:
    def __init__(self, settings: AgentSettings) -> None:
        signing = settings.signing
        key = load_private_key(
            signing.private_key.get_secret_value() if signing.private_key else None, signing.private_key_file,
            "signing")
        self.sealer = Sealer(key)
        self.places = PlaceOpener(key)
        """Decrypts sealed Places: the agent's X25519 key is derived from its signing key."""
        if not settings.dispatcher_public_keys:
            raise Invalid("dispatcher_public_keys", "no dispatcher key: Commands could not be verified, every "
                          "one would be refused", fix="set it to the dispatcher's public key "
                          "(`mkctl keys public --private-key-file ...` prints it)")
        self.dispatcher_keys = [parse_public_key(text, f"dispatcher_public_keys[{i}]")
                                for i, text in enumerate(settings.dispatcher_public_keys)]
        self.opener = Opener(max_age_seconds=signing.max_age_seconds)
        self.skew_ms = int(signing.clock_skew_seconds * 1000)
        self.refused = 0

    def seal(self, topic: str, body: bytes, stream: str, n: int) -> bytes:
        return self.sealer.seal(topic, body, stream=stream, n=n)

    def open_command(self, topic: str, payload: bytes, linked_at_ms: int) -> bytes | None:
        """The bytes of a message holding one Command, or None when refused (see ``open_commands``)."""
        bodies = self.open_commands(topic, payload, linked_at_ms)
        return bodies[0] if len(bodies) == 1 else None

    def open_commands(self, topic: str, payload: bytes, linked_at_ms: int) -> list[bytes]:
        """The Commands' own bytes, in order: one, or the items of a batch (``messages.split_commands``);
        a refused message gives none, a refused item is left out (each logged and counted by reason).

        ``linked_at_ms``: when this process's first link came up (not the current link's: see the module).
        A batch is signed once: its time judges every item, a Delete applying whenever it was sealed."""
        try:
            opened = self.opener.open(topic, payload, self.dispatcher_keys)
            bodies = split_commands(opened.body)
        except Refused as exc:
            self.refused += 1
            log.warning("refused command on %s (%s): %s", topic, exc.why, exc.message)
            return []
        except MessageRefused as exc:
            self.refused += 1
            refused("malformed")
            log.warning("refused command on %s (malformed): %s", topic, exc)
            return []
        early = opened.t < linked_at_ms - self.skew_ms
        out: list[bytes] = []
        for body in bodies:
            if early and not self._is_delete(body):
                self.refused += 1
                refused("expired")
                log.warning("refused command on %s (expired): sealed before this agent first connected (a replay, "
                            "or a Command the dispatcher sends again on its own)", topic)
                continue
            if is_sealed(body):
                try:
                    body = self.places.open(topic, body)
                except Refused as exc:
                    self.refused += 1
                    refused(exc.why)
                    log.warning("refused command on %s (%s): %s", topic, exc.why, exc.message)
                    continue
            out.append(body)
        return out

    @staticmethod
    def _is_delete(body: bytes) -> bool:
        """A Delete applies whenever it was sealed: carried out again it removes only what the dispatcher
        already decided to remove, and the fencing Deletes queued while the cluster was cut off must
        apply before anything it suspended resumes."""
        try:
            return decode_command(body).type == "delete"
        except MessageRefused:
            return False
