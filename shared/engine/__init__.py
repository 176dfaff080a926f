"""The engine: agent wiring, scheduler, planning, dispatch, execution and its endings, fleets,
supervisor, notifications, the local runner, and the operator actions (``operations``) that every
front end calls. Imports ``shared.control``, ``shared.messaging``, ``shared.telemetry`` and below;
never a front end (``shared.web``, ``shared.ops``, ``shared.cli``, ``functions``)."""
