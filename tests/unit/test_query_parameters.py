"""How a named query's ``:name`` parameters are found (shared/control/queries.py): only in SQL
text, never in comments, string literals, quoted identifiers or dollar-quoted bodies. An
apostrophe in a comment once opened a "string" that ran to the next apostrophe, and every
parameter in between was sent to the database as text, silently."""

from __future__ import annotations

import pytest

from shared.control.queries import DIALECTS, load_queries, parse_query_file, to_qmark


def test_an_apostrophe_in_a_comment_hides_no_parameter():
    statement = to_qmark("SELECT 1 -- the job's run\nFROM t WHERE a = :a -- isn't it\nAND b = :b")
    assert statement.params == ("a", "b")
    assert statement.sql.count("?") == 2


def test_an_apostrophe_in_a_block_comment_hides_no_parameter():
    assert to_qmark("/* the agent's\n own */ SELECT :a, :b").params == ("a", "b")


@pytest.mark.parametrize("text", [
    "SELECT ':a'", "SELECT 'it''s :a'", "SELECT 1 -- :a", "SELECT /* :a */ 1",
    'SELECT 1 AS ":a"', "SELECT $$ :a $$", "SELECT $body$ it's :a $body$", "SELECT x::int",
    "SELECT '12:30'", "SELECT '--' || 'x'",
])
def test_text_that_is_not_sql_has_no_parameter(text):
    statement = to_qmark(text)
    assert statement.params == () and statement.sql == text


def test_a_comment_marker_in_a_string_starts_no_comment():
    assert to_qmark("SELECT '-- not a comment', :a").params == ("a",)


@pytest.mark.parametrize("text, what", [
    ("SELECT 'open :a", "string literal"),
    ('SELECT "open :a', "quoted identifier"),
    ("SELECT /* open :a", "comment"),
])
def test_an_unterminated_literal_is_an_error_not_hidden_parameters(text, what):
    with pytest.raises(ValueError, match=what):
        to_qmark(text)


def test_a_query_file_names_the_query_that_cannot_be_read():
    with pytest.raises(ValueError, match=r"q.sql: query 'broken': unterminated string literal"):
        parse_query_file("-- broken --\n-- a broken query\nSELECT 'x FROM t WHERE a = :a;\n", source="q.sql")


def test_every_dialect_asks_for_the_same_parameters_of_each_query():
    """The engine passes one set of arguments whatever the dialect: a parameter hidden (or
    misspelt) in one dialect's text shows here as a difference from the others."""
    queries = {dialect: load_queries(dialect) for dialect in DIALECTS}
    names = set().union(*(set(q) for q in queries.values()))
    assert len(names) > 50
    for name in sorted(names):
        asked = {dialect: sorted(queries[dialect][name].parameters) for dialect in DIALECTS}
        assert len({tuple(v) for v in asked.values()}) == 1, (name, asked)
