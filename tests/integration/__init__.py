"""Tests against the real stand-ins: PostgreSQL (through pyodbc), SQLite, Azurite, and SQL Server or
Babelfish when AGENT_TEST_MSSQL is set."""
