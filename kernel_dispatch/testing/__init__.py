"""Helpers shared by the tests and the tools in scripts/ (TileLang kernel caches carried to a GPU machine)."""
