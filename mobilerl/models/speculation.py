"""Cheap guesses of a greedy row's next tokens, which the HF backend checks in a forward it runs anyway.

A guess is taken only as far as the model's own greedy choices agree with it, so the output is what plain
greedy decoding gives; a good guess saves decoding forwards. Two sources: :class:`PromptLookup` copies what
followed the latest earlier occurrence of the last tokens (answers copy their prompt, loops repeat), and
:class:`ResponseLookup` follows how the backend's recent answers went on (agent answers are formulaic).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence


class PromptLookup:
    """Guesses a row's next tokens for speculative decoding by prompt lookup: find the latest earlier place
    where the text's last ``n`` tokens (``n`` = 3, 2, 1) occurred, in the prompt or the tokens generated so
    far, and copy what followed it. The copy may run into the tokens it is producing (as an LZ77 copy does), so
    a loop of one token or phrase is guessed to any length. Answers here copy the prompt (a ``Type`` text is
    a span of the task, an element's index or the format from the history), and a degenerate answer repeats
    one token to the length cap.

    N-grams are indexed incrementally (a dict per ``n``), so a guess costs O(k) after the prompt's one pass.
    """

    def __init__(self, prompt: list[int], max_n: int = 3) -> None:
        self.ctx = list(prompt)
        self.n_prompt = len(prompt)
        self.max_n = max_n
        self.index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]
        self.indexed = 0  # n-grams ending at positions < indexed are in the index

    def draft(self, generated: list[int], k: int) -> list[int]:
        """Up to ``k`` guessed tokens after prompt + ``generated`` (``generated`` only grows between calls)."""
        ctx = self.ctx
        ctx.extend(generated[len(ctx) - self.n_prompt:])
        end = len(ctx)
        for e in range(max(self.indexed, 1), end):  # every n-gram ending before the last position
            for n in range(1, min(self.max_n, e) + 1):
                self.index[n][tuple(ctx[e - n:e])] = e
        self.indexed = end
        for n in range(min(self.max_n, end - 1), 0, -1):
            src = self.index[n].get(tuple(ctx[end - n:]))
            if src is not None:
                out: list[int] = []
                for i in range(k):
                    j = src + i
                    out.append(ctx[j] if j < end else out[j - end])
                return out
        return []


class ResponseLookup:
    """Guesses how a response goes on from the responses generated before it: counts of which token followed
    each 1-, 2- and 3-token context in the last ``window`` responses (each preceded by a start mark, so an
    empty response is guessed to begin as most of them began); the longest context seen decides, its most
    frequent successor wins. An agent's answers are formulaic (``<answer>do(action="Tap", index=`` begins two
    in three of the tiny policy's), and a guess costs nothing when it is checked inside the prompt's prefill.
    """

    START = -1

    def __init__(self, max_n: int = 3, window: int = 256) -> None:
        self.max_n, self.window = max_n, window
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        self.recent: deque[list[int]] = deque()

    def _ngrams(self, tokens: list[int]) -> Iterator[tuple[tuple[int, ...], int]]:
        ctx = [self.START, *tokens]
        for e in range(1, len(ctx)):
            for n in range(1, min(self.max_n, e) + 1):
                yield tuple(ctx[e - n:e]), ctx[e]

    def add(self, tokens: Sequence[int]) -> None:
        """Count a finished response (forgetting the oldest beyond ``window``)."""
        tokens = list(tokens)
        self.recent.append(tokens)
        for key, nxt in self._ngrams(tokens):
            succ = self.counts.setdefault(key, {})
            succ[nxt] = succ.get(nxt, 0) + 1
        if len(self.recent) > self.window:
            for key, nxt in self._ngrams(self.recent.popleft()):
                succ = self.counts[key]
                succ[nxt] -= 1
                if not succ[nxt]:
                    del succ[nxt]
                    if not succ:
                        del self.counts[key]

    def draft(self, generated: Sequence[int], k: int, stop: set[int] | frozenset[int] = frozenset(),
              min_share: float = 0.0) -> list[int]:
        """Up to ``k`` guessed tokens after ``generated``; the guess ends after a token of ``stop``, or before
        a token that followed its context less than ``min_share`` of the time."""
        ctx, out = [self.START, *generated], []
        while len(out) < k:
            succ = next((self.counts[key] for n in range(min(self.max_n, len(ctx)), 0, -1)
                         if (key := tuple(ctx[-n:])) in self.counts), None)
            if succ is None:
                break
            tok = max(succ, key=succ.__getitem__)
            if succ[tok] < min_share * sum(succ.values()):
                break
            out.append(tok)
            ctx.append(tok)
            if tok in stop:
                break
        return out
