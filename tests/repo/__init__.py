"""Checks of the repository's own files: README, docs, Bicep, .funcignore, scripts, lint, packaging."""
