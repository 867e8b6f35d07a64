"""Helpers the tests share: reference parsers, fuzz cases, a fake upstream, a CDP browser."""
