"""Prompts generated locally and deterministically (seeded): no dataset, no download.

- `filler_text(seed, words)`: plain English-like prose from a fixed word list.
- `greedy_prompts(n)`: short varied openings for the greedy agreement check.
- `needle_prompt(...)` and `mrcr_prompt(...)`: synthetic retrieval tasks (a passphrase hidden at a
  depth of a haystack; multi-round coreference: repeat the k-th of several notes on one topic).
  Each returns the pieces as text; `longctx` tokenizes them and fits them to an exact token length.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RetrievalTask", "filler_text", "greedy_prompts", "mrcr_task", "needle_task"]

_WORDS = (
    "the of and to in is that it was for on are as with his they at be this from have or by one "
    "had not but what all were when we there can an your which their said if do will each about "
    "how "
    "up out them then she many some so these would other into has more her two like him see time "
    "could no make than first been its who now people my made over did down only way find use may "
    "water long little very after words called just where most know get through back much before "
    "go good new write our used me man too any day same right look think also around another came "
    "come work three word must because does part even place well such here take why things help "
    "put years different away again off went old number great tell men say small every found still "
    "between name should home big give air line set own under read last never us left end along "
    "while might next sound below saw something thought both few those always looked show large "
    "often together asked house world going want school important until form food keep children "
    "feet land side without boy once animals life enough took sometimes four head above kind began "
    "almost live page got earth need far hand high year mother light parts country father let "
    "night "
    "following picture being study second eyes soon times story boys since white days ever paper "
    "hard near sentence better best across during today others however sure means knew river"
).split()

_OPENINGS = (
    "Once upon a time",
    "The quick brown fox",
    "In the beginning",
    "def main():",
    "Dear team,",
    "Question: what is",
    "The results show that",
    "import numpy as np",
    "It was a dark and",
    "Step 1: open the",
    "The capital of France",
    "SELECT name FROM",
    "My favourite food is",
    "According to the report",
    "for i in range(",
    "The weather today",
    "Chapter 1.",
    "Hello, my name is",
    "The recipe calls for",
    "In 1969, the first",
    "class Node:",
    "The train left the",
    "To install the package",
    "She looked at the",
)

_CITIES = (
    "Lisbon",
    "Nairobi",
    "Osaka",
    "Quito",
    "Tallinn",
    "Hobart",
    "Cusco",
    "Bergen",
    "Tunis",
    "Perth",
)
_TOPICS = ("rivers", "owls", "bridges", "tea", "comets", "violins", "deserts", "trains")


def filler_text(seed: int, words: int) -> str:
    """`words` words of sentence-shaped filler, identical for the same seed."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < words:
        length = rng.randint(6, 16)
        sentence = [rng.choice(_WORDS) for _ in range(length)]
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += "."
        out.extend(sentence)
    return " ".join(out[:words])


def greedy_prompts(n: int, seed: int = 0) -> list[str]:
    """`n` distinct short prompts: a fixed opening plus a few seeded words."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        opening = _OPENINGS[i % len(_OPENINGS)]
        tail = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 6)))
        prompts.append(f"{opening} {tail}".strip())
    return prompts


@dataclass(frozen=True)
class RetrievalTask:
    """A retrieval prompt in three parts: `before` + `insert` + `after` filler, then `question`.

    `longctx` trims the fillers so the whole prompt has an exact token length, and puts `insert`
    at `depth` (0..1) of the haystack. The answer is right when the completion starts with
    `answer` (after stripping whitespace).
    """

    kind: str
    insert: str
    question: str
    answer: str
    depth: float
    seed: int


def needle_task(seed: int, depth: float) -> RetrievalTask:
    rng = random.Random(seed)
    city = rng.choice(_CITIES)
    code = str(rng.randint(1_000_000, 9_999_999))
    return RetrievalTask(
        kind="needle",
        insert=f"\nThe secret passphrase for {city} is {code}.\n",
        question=f"\nQuestion: what is the secret passphrase for {city}?\n"
        f"Answer: The secret passphrase for {city} is",
        answer=code,
        depth=depth,
        seed=seed,
    )


def mrcr_task(seed: int, depth: float, *, notes: int = 6) -> RetrievalTask:
    """Several notes on a few topics; ask for the k-th note on one topic (order of appearance)."""
    rng = random.Random(seed)
    topics = rng.sample(_TOPICS, 3)
    lines = []
    seen: dict[str, list[str]] = {t: [] for t in topics}
    for i in range(notes):
        topic = topics[i % len(topics)] if i < len(topics) else rng.choice(topics)
        body = " ".join(rng.choice(_WORDS) for _ in range(5))
        seen[topic].append(body)
        lines.append(f"User: write a short note about {topic}.\nAssistant: {body}.")
    target = max(topics, key=lambda t: len(seen[t]))
    k = len(seen[target])
    ordinal = {1: "first", 2: "second", 3: "third", 4: "fourth"}.get(k, f"{k}th")
    tag = f"{rng.randint(1000, 9999):x}"
    return RetrievalTask(
        kind="mrcr",
        insert="\n" + "\n".join(lines) + "\n",
        question=f"\nUser: prepend {tag} to the {ordinal} note about {target} and repeat it "
        f"exactly.\nAssistant: {tag}",
        answer=seen[target][-1],
        depth=depth,
        seed=seed,
    )
