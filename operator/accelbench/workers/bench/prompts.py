"""Prompts of an exact token length, each opening with a unique salt.

Length is exact when a real tokenizer is at hand, tried in this order:
1. the engine's own `/tokenize` + `/detokenize` (vLLM offers both): the count the server will use;
2. the model's tokenizer from a local directory (`--tokenizer DIR`, transformers AutoTokenizer);
3. otherwise an approximation: common English words counted as one token each. It is flagged in
   the results (`tokenizer.exact = false`), and the server's own prompt count (usage) is recorded
   per cell, so the real input length is still reported.

Input length means what the engine processes, special tokens (BOS) included. For chat requests
the length is that of the user message; the chat template adds a few tokens the server reports.

The salt (a counter and random hex at the very start) makes every prompt's first block unique, so
an engine's prefix cache cannot serve any of it from a previous request.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

import aiohttp

# Frequent English words that are a single token (with their leading space) in the Llama, Gemma,
# Qwen and GPT-2 vocabularies: the approximation counts one token per word.
_WORD_TEXT = (
    "the of and to in is was for on with as by at from that this are be or an it not which have "
    "but has had they were their one all also more can its been after first new two time would "
    "other year over when into most only some about out city may made there such up these her "
    "many during so then both where world between him later under state part used work he she "
    "team see well film them then three over each high well long name place life game area set "
    "day line war house water small way known world people great south north east west"
)
WORDS = tuple(dict.fromkeys(_WORD_TEXT.split()))  # unique, in order


class Tokenizer(Protocol):
    source: str
    exact: bool

    async def count(self, text: str) -> int:
        """Tokens the engine would see for this prompt, special tokens included."""
        ...

    async def encode(self, text: str) -> list[int]:
        """Token ids without special tokens."""
        ...

    async def decode(self, ids: list[int]) -> str: ...


class ServerTokenizer:
    """vLLM's /tokenize and /detokenize."""

    source = "server"
    exact = True

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str) -> None:
        self._session = session
        self._base = base_url.rstrip("/")
        self._model = model

    async def _tokenize(self, text: str, special: bool) -> list[int]:
        body = {"model": self._model, "prompt": text, "add_special_tokens": special}
        async with self._session.post(f"{self._base}/tokenize", json=body) as resp:
            resp.raise_for_status()
            return list((await resp.json())["tokens"])

    async def count(self, text: str) -> int:
        return len(await self._tokenize(text, True))

    async def encode(self, text: str) -> list[int]:
        return await self._tokenize(text, False)

    async def decode(self, ids: list[int]) -> str:
        body = {"model": self._model, "tokens": ids}
        async with self._session.post(f"{self._base}/detokenize", json=body) as resp:
            resp.raise_for_status()
            return str((await resp.json())["prompt"])


async def probe_server_tokenizer(
    session: aiohttp.ClientSession, base_url: str, model: str
) -> ServerTokenizer | None:
    """The engine's tokenizer when it answers /tokenize and /detokenize; None otherwise."""
    tok = ServerTokenizer(session, base_url, model)
    try:
        ids = await tok.encode("hello world")
        await tok.decode(ids)
    except (aiohttp.ClientError, KeyError, ValueError, TypeError):
        return None
    return tok if ids else None


class LocalTokenizer:
    """The model's tokenizer from a directory (no hub access: local files only)."""

    source = "local"
    exact = True

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)

    async def count(self, text: str) -> int:
        return len(self._tok(text, add_special_tokens=True)["input_ids"])

    async def encode(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    async def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))


class ApproxTokenizer:
    """One token per whitespace-separated word: the documented fallback, flagged as inexact."""

    source = "approximate"
    exact = False
    _index = {w: i for i, w in enumerate(WORDS)}

    async def count(self, text: str) -> int:
        return len(text.split())

    async def encode(self, text: str) -> list[int]:
        # Unknown words (the salt) get ids past the word list; decode cannot map them back, so
        # the builder never decodes salt ids with this tokenizer (it re-adds the salt as text).
        return [self._index.get(w, len(WORDS)) for w in text.split()]

    async def decode(self, ids: list[int]) -> str:
        return " ".join(WORDS[i % len(WORDS)] for i in ids)


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: int  # as counted by the tokenizer (exact or not)
    target: int


def salt_text(index: int, rng: random.Random) -> str:
    return f"{index:x}{rng.getrandbits(48):012x}"


class PromptFactory:
    """Builds prompts of `target` tokens: salt words, then text drawn from a random word pool."""

    def __init__(self, tokenizer: Tokenizer, seed: int = 0, max_adjust: int = 6) -> None:
        self.tokenizer = tokenizer
        self._rng = random.Random(seed)
        self._pool: list[int] = []
        self._special = 0
        self._max_adjust = max_adjust
        self._counter = 0
        self.inexact = 0  # prompts that missed their target even after adjusting

    async def prepare(self, longest: int) -> None:
        """Tokenize one long random text once; prompts are slices of it."""
        self._special = await self.tokenizer.count("")
        words: list[str] = []
        while True:
            words += [self._rng.choice(WORDS) for _ in range(max(longest, 64) + 64)]
            self._pool = await self.tokenizer.encode(" ".join(words))
            if len(self._pool) >= longest + 64:
                return

    async def build(self, target: int) -> Prompt:
        self._counter += 1
        salt = salt_text(self._counter, self._rng)
        want = max(target - self._special, 0)
        offset = self._rng.randrange(0, max(len(self._pool) - want - 64, 1))
        body = self._pool[offset : offset + want + 64]
        # Salt goes in as text: `salt: body...`. The body is trimmed until the whole counts right.
        keep = want
        text, count = "", 0
        for _ in range(self._max_adjust):
            text = f"{salt}: {await self.tokenizer.decode(body[:keep])}" if keep > 0 else salt
            count = await self.tokenizer.count(text)
            if count == target or keep <= 0:
                break
            keep = max(keep + (target - count), 0)
        if count != target:
            self.inexact += 1
        return Prompt(text=text, tokens=count, target=target)
