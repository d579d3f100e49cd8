"""Exports of a trace with profkit's findings to other tools' formats (Perfetto)."""
