"""Reading SQL Server Agent job scripts: the bytes decoded (source), the T-SQL cut into tokens
and batches (lexer), run statement by statement (interpreter) over a model of msdb's job
tables and procedures (msdb). shared/ops/sqlagent_import.py turns the resulting jobs into this
agent's settings."""
