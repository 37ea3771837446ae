"""Messages read as sentences: "1 PE", not "1 PEs"; an error's text embedded in
another message is cut at a word boundary with an ellipsis, never mid-word
("... Ev)"), or not cut (issue 33 item 13)."""

import re
from pathlib import Path

import pytest

from shmemvm import _args
from shmemvm.errors import clip, plural

PACKAGE = Path(_args.__file__).resolve().parent


def test_plural():
    assert plural(1, "PE") == "1 PE" and plural(0, "PE") == "0 PEs"
    assert plural(3, "PE") == "3 PEs" and plural(2, "allocation") == "2 allocations"


def test_one_pe_is_singular():
    with pytest.raises(ValueError) as info:
        _args.pe(1, 1)
    message = str(info.value)
    assert "1 PE " in message and "1 PEs" not in message, message


def test_clip_cuts_at_a_word_boundary():
    text = "PeerDeadError: PE 1 has left the heap: an exception nobody caught " * 10
    cut = clip(text, 100)
    assert len(cut) <= 100 and cut.endswith(" ...")
    kept = cut.removesuffix(" ...")
    assert text.startswith(kept) and text[len(kept)] == " ", cut  # a whole word ends there
    assert clip("short", 100) == "short"
    assert clip("x" * 300, 100) == "x" * 96 + " ..."   # one word longer than the room


def test_no_message_counts_pes_without_plural():
    """An f-string "{n} PEs" says "1 PEs" for n = 1: plural(n, 'PE') says it right."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\{[^{}]+\} PEs\b", line):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


#: slices in messages that are no text cut mid-word: lists shown in part, and a
#: huge integer's digits shown as "1234...5678, N digits"
NOT_TEXT = ("{counts[:16]}", "{current[:16]}", "{text[:12]}...{text[-6:]}, {len(text)} digits")


def test_no_message_cuts_an_embedded_text_mid_word():
    """A slice of a text inside an f-string ({text[:200]}) cuts mid-word: clip() it."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if any(allowed in line for allowed in NOT_TEXT):
                continue
            if re.search(r"\{[\w.]+\[:\s*\d+\s*\]\}", line):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
