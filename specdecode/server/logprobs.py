"""Logprobs in OpenAI's two shapes: chat's `content` list and completions' parallel arrays.

A token is shown as its own decoded text (vLLM does the same), with its UTF-8 bytes in the chat shape: a token
that holds part of a multi-byte character decodes to U+FFFD, and its bytes are what a client can join.

A token that top-k or top-p filtered out has log-probability -inf, which JSON cannot carry (the response
failed with a 500 when a request asked for more alternatives than the filter kept): it is sent as
LOGPROB_FLOOR, vLLM's and OpenAI's -9999.0.
"""

from __future__ import annotations

from specdecode.step.sequence import TokenLogprob

LOGPROB_FLOOR = -9999.0


def finite(logprob: float) -> float:
    """The log-probability as JSON can carry it: -inf (and NaN, which never should reach here) as the floor."""
    return logprob if logprob > LOGPROB_FLOOR else LOGPROB_FLOOR


class LogprobFormats:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}

    def token(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            text = self._text[token_id] = self.tokenizer.decode([token_id])
        return text

    def _entry(self, token_id: int, logprob: float) -> dict:
        text = self.token(token_id)
        return {"token": text, "logprob": finite(logprob), "bytes": list(text.encode("utf-8"))}

    def chat_logprobs(self, logprobs: list[TokenLogprob]) -> dict:
        content = [
            self._entry(lp.token_id, lp.logprob) | {"top_logprobs": [self._entry(t, v) for t, v in lp.top]}
            for lp in logprobs
        ]
        return {"content": content, "refusal": None}

    def completion_logprobs(self, logprobs: list[TokenLogprob], offset: int = 0) -> dict:
        tokens = [self.token(lp.token_id) for lp in logprobs]
        offsets, at = [], offset
        for t in tokens:
            offsets.append(at)
            at += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": [finite(lp.logprob) for lp in logprobs],
            "top_logprobs": [{self.token(t): finite(v) for t, v in lp.top} for lp in logprobs],
            "text_offset": offsets,
        }
