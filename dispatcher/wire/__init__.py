"""The wire: Commands out to the agents and Reports in from them, over MQTT.

``outbox.py`` publishes the Command rows the engine committed (signed as they go, marked sent after the
broker's ack); ``freshrows.py`` is the in-memory queue of those rows between engine and outbox, within a
byte budget; ``reports.py`` subscribes to the agents' Reports and heartbeats and puts them into the
engine's inbox (and heartbeats to the lease desk); ``streams.py`` detects Reports lost on an agent's
stream (which clusters need a Resync); ``podstreams.py`` asks an agent for a placed Job's pods and logs
and hands the answers, in order, to the HTTP request waiting for them; ``workercauses.py`` asks it about placed
Jobs' pods and tells why they do not run as Warning Events on the manager Jobs. ``freshrows``, ``streams`` and
``podstreams`` import nothing of the dispatcher; ``outbox`` may import ``dispatcher.db`` and ``settings``;
``reports`` the engine's loop and the lease desk; ``workercauses`` the database and ``podstreams``.
"""
