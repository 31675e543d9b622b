"""GitHub Actions workflow commands: one annotation per finding, shown on the pull request's diff.

``::warning file=train.py,line=2,col=10,endLine=2,endColumn=35,title=TC202 deprecated-amp-api::message``
(the finding's explanation, where it has one, follows the message after a blank line).

Escaping follows the runner's rules (actions/toolkit ``command.ts``): ``%``, CR and LF in the
message; additionally ``:`` and ``,`` in property values, which would otherwise end the value.
"""

from __future__ import annotations

from typing import TextIO

from tcaudit.terminal import terminal_safe

COMMANDS = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(text: str) -> str:
    # The runner's log is a terminal too (it renders escape sequences): what is left after its own
    # escapes is shown escaped.
    return terminal_safe(text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(command: str, message: str, **properties: object) -> str:
    props = ",".join(f"{key}={escape_property(str(value))}" for key, value in properties.items() if value is not None)
    return f"::{command}{' ' + props if props else ''}::{escape_data(message)}\n"


def render(result, out: TextIO, *, rules, color: bool) -> None:
    for f in result.findings:
        loc = f.location
        position: dict[str, int] = {"line": loc.line}
        # GitHub accepts columns only on one-line spans (as its checks API documents) and rejects an
        # end before the start; a multi-line finding is sent as a line range, a zero-width one as a point.
        if loc.end_line > loc.line:
            position["endLine"] = loc.end_line
        else:
            position["col"] = loc.column
            if loc.end_line == loc.line and loc.end_column > loc.column:
                position.update(endLine=loc.end_line, endColumn=loc.end_column)
        # A notebook's lines count within the cell, which the title names (``cell 3: TC201 ...``).
        title = f"{f.rule} {f.name}" if loc.cell is None else f"cell {loc.cell}: {f.rule} {f.name}"
        # The message, then the explanation on the lines below it (the annotation shows both).
        text = f"{f.message}\n\n{f.explanation}" if f.explanation else f.message
        out.write(annotation(COMMANDS[str(f.severity)], text, file=loc.path, **position, title=title))
    for note in result.notes:
        out.write(annotation("notice", note, title="tcaudit"))
