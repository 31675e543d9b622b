"""Text from the user's files made safe to print on a terminal.

A scanned file, its name or a model's exception can hold escape sequences: an OSC that retitles the
window, OSC 52 that writes the clipboard, a clear-screen, a carriage return that overwrites the line
before, bidirectional overrides that show code other than what runs. Every reporter that can reach a
terminal (text, concise, github), the progress line and the CLI's messages pass user text through :func:`terminal_safe`,
which shows each such character escaped (``\\x1b``, ``\\u202e``) instead of sending it.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional and invisible format marks.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]")
_UNSAFE_ON_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]")


def _shown(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, *, one_line: bool = False) -> str:
    """``text`` with every control, escape and direction character shown escaped; newlines and tabs
    kept (``one_line``: escaped too)."""
    return (_UNSAFE_ON_ONE_LINE if one_line else _UNSAFE).sub(_shown, text)
