"""Incremental detokenization that never emits a broken UTF-8 character.

Byte-level BPE splits multi-byte characters across tokens; decoding a prefix then ends in U+FFFD. We decode a
short window of recent tokens and hold text back while it ends in U+FFFD (the offsets scheme of vLLM/TGI).
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 6  # tokens decoded before the new ones so merges across the boundary render correctly


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0  # start of the window decoded for context
        self.read_offset = len(self.ids)  # tokens before this are already emitted as text
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, new_ids: list[int]) -> str:
        """Append tokens; return the newly completed text (possibly empty)."""
        self.ids.extend(new_ids)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if full.endswith(REPLACEMENT) or len(full) <= len(prefix):
            return ""
        delta = full[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta


def find_stop(text: str, stops: list[str], start: int) -> int | None:
    """Where the earliest stop string begins in text[start:] (as an index of text), or None.

    `start` is the length of the text already sent: no stop string can begin before it, because text that could
    still begin one is never sent (`stop_holdback`).
    """
    hits = [at for at in (text.find(s, start) for s in stops) if at != -1]
    return min(hits) if hits else None


def stop_holdback(text: str, stops: list[str]) -> int:
    """How many characters at the end of `text` could be the start of a stop string, so must not be sent yet.

    The longest suffix of the text that is a proper prefix of some stop string (vLLM holds text back the same way):
    once a stop string completes, the text is cut before it, and text already sent cannot be taken back.
    """
    held = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), held, -1):
            if text.endswith(stop[:n]):
                held = n
                break
    return held
