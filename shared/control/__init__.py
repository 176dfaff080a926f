"""The control database: connection strings and connections, the pool, the named queries, the
store, the SQL files and migrations (``sql/``), SQL error classification. Imports ``shared.settings``
and the layers below it, never the engine or a front end."""
