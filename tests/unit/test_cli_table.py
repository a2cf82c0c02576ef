"""The read commands' plain tables (``cli.output.table_text``): columns as
wide as their widest cell, two spaces apart, numbers right-aligned, one line
per row, styles only where asked for."""

from __future__ import annotations

from cli.output import Styled, table_text

COLUMNS = {"ID": True, "STATE": False, "ERROR": False}


def test_columns_align_and_rows_stay_one_line_each():
    text = table_text(COLUMNS, [("7", Styled("running", "cyan"), ""),
                                ("12", "failed", "boom:\nline two")])
    assert text.splitlines() == [
        "ID  STATE    ERROR",
        " 7  running",
        "12  failed   boom: line two",
    ]


def test_colour_styles_the_header_and_styled_cells_only():
    text = table_text(COLUMNS, [("7", Styled("running", "cyan"), "x")], colour=True)
    header, row = text.splitlines()
    assert header.startswith("\x1b[1mID\x1b[0m")
    assert row == " 7  \x1b[36mrunning\x1b[0m  x"
