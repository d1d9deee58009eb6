"""Text from files as data, never markup: one escape per output format.

Names are checked when they are read (`ablate.store.check_name`); these escapes are the second wall,
for every cell and line a renderer writes, whatever it holds (a status, a reason, a probe's header).
"""

from __future__ import annotations

LATEX_SPECIALS = {
    "\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#", "%": r"\%",
    "_": r"\_", "^": r"\^{}", "~": r"\~{}", "<": r"\textless{}", ">": r"\textgreater{}",
}


def one_line(text: object) -> str:
    """`text` on one line: a line break in a cell or a list item would start a forged row."""
    return " ".join(str(text).splitlines()) if text is not None else ""


def markdown_text(text: object) -> str:
    """A markdown line (list item, heading): one line, nothing more."""
    return one_line(text)


def markdown_cell(text: object) -> str:
    """A markdown table cell: one line, pipes escaped (`a|b` stays one cell)."""
    return one_line(text).replace("\\", "\\\\").replace("|", "\\|")


def latex_text(text: object) -> str:
    """LaTeX text (a cell or a comment line): one line, every special character printed as itself."""
    return "".join(LATEX_SPECIALS.get(char, char) for char in one_line(text))
