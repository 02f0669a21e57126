"""A small deterministic "language" for the miniature benchmark.

The real benchmark fine-tunes a pretrained Llama on GovReport: long documents
followed by a summary, loss on the summary only. Here a document is a few
sentences with three hidden attributes: its topic (which words it uses), its
region (which named entities it mentions) and its tone (how its sentences
end, a noisy signal). Its summary names the three attributes. Pretraining
documents carry the attributes as a title *before* the text, so the base model
knows the attribute tokens and how they shape a text, but has never had to infer
them from a text it has read: that is what the LoRA fine-tune learns, and the
summary loss falls from about 2 to well under the 0.925 target as it does.

The grammar itself (topic vocabularies, word transitions) is fixed by
GRAMMAR_SEED so that the pretraining corpus, the fine-tuning data and any
re-generation all speak the same language; the sample seed only decides which
documents are drawn.
"""

from __future__ import annotations

import numpy as np

GRAMMAR_SEED = 20250604

PAD, BOS, EOS, SUMMARY, END = 0, 1, 2, 3, 4
N_TOPICS = 16
N_REGIONS = 8
N_TONES = 8
ENTITIES_PER_REGION = 4
N_WORDS = 160
TOPIC_BASE = 5
REGION_BASE = TOPIC_BASE + N_TOPICS
TONE_BASE = REGION_BASE + N_REGIONS
STOP_BASE = TONE_BASE + N_TONES  # one sentence-ending mark per tone
ENTITY_BASE = STOP_BASE + N_TONES
WORD_BASE = ENTITY_BASE + N_REGIONS * ENTITIES_PER_REGION
VOCAB_SIZE = 256  # WORD_BASE + N_WORDS = 237, rounded up as real vocabularies are
assert WORD_BASE + N_WORDS <= VOCAB_SIZE

SENTENCES_PER_DOC = 4
SENTENCE_WORDS = (5, 8)  # inclusive range of words per sentence
ENTITIES_PER_DOC = 2
WORDS_PER_TOPIC = 32
SUCCESSORS_PER_WORD = 4
TONE_FIDELITY = 0.7  # chance a sentence ends with its document's tone mark rather than a random one
SUMMARY_LEN = 5  # SUMMARY topic region tone EOS
SEQ_LEN = 4 + SENTENCES_PER_DOC * (SENTENCE_WORDS[1] + 1) + ENTITIES_PER_DOC + SUMMARY_LEN


class Grammar:
    """Per-topic word subsets and sparse bigram transitions, fixed by GRAMMAR_SEED."""

    def __init__(self) -> None:
        rng = np.random.default_rng(GRAMMAR_SEED)
        self.topic_words = [rng.choice(N_WORDS, size=WORDS_PER_TOPIC, replace=False) for _ in range(N_TOPICS)]
        # successors[t][i] are indices into topic_words[t]; a word's next word is one
        # of a few favourites, so documents have learnable local structure.
        self.successors = [
            rng.integers(0, WORDS_PER_TOPIC, size=(WORDS_PER_TOPIC, SUCCESSORS_PER_WORD)) for _ in range(N_TOPICS)
        ]
        self.successor_p = np.array([0.55, 0.25, 0.12, 0.08])


def _sentence(grammar: Grammar, topic: int, tone: int, rng: np.random.Generator) -> list[int]:
    n = int(rng.integers(SENTENCE_WORDS[0], SENTENCE_WORDS[1] + 1))
    i = int(rng.integers(0, WORDS_PER_TOPIC))
    words = []
    for _ in range(n):
        words.append(WORD_BASE + int(grammar.topic_words[topic][i]))
        i = int(grammar.successors[topic][i][rng.choice(SUCCESSORS_PER_WORD, p=grammar.successor_p)])
    mark = tone if rng.random() < TONE_FIDELITY else int(rng.integers(0, N_TONES))
    return words + [STOP_BASE + mark]


def document(grammar: Grammar, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """One document's text and its attributes (topic, region, tone) as tokens."""
    topic = int(rng.integers(0, N_TOPICS))
    region = int(rng.integers(0, N_REGIONS))
    tone = int(rng.integers(0, N_TONES))
    text: list[int] = []
    for _ in range(SENTENCES_PER_DOC):
        text += _sentence(grammar, topic, tone, rng)
    picks = rng.choice(ENTITIES_PER_REGION, size=ENTITIES_PER_DOC, replace=False)
    entities = [ENTITY_BASE + region * ENTITIES_PER_REGION + int(e) for e in picks]
    # Entities go in at distinct random places within the text.
    slots = sorted(int(s) for s in rng.choice(len(text), size=ENTITIES_PER_DOC, replace=False))
    for offset, (slot, ent) in enumerate(zip(slots, entities)):
        text.insert(slot + offset, ent)
    return text, [TOPIC_BASE + topic, REGION_BASE + region, TONE_BASE + tone]


def summarization_samples(n: int, seed: int) -> list[dict]:
    """`n` samples in the GovReport npy contract: padded input_ids, loss_mask on the
    summary tokens after the SUMMARY marker, seq_start_id [0] (one sequence each)."""
    grammar = Grammar()
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        text, attributes = document(grammar, rng)
        prompt = [BOS] + text + [SUMMARY]
        summary = attributes + [EOS]
        ids = prompt + summary
        mask = [0] * len(prompt) + [1] * len(summary)
        pad = SEQ_LEN - len(ids)
        samples.append(
            {
                "input_ids": np.array(ids + [PAD] * pad, dtype=np.int64),
                "loss_mask": mask + [0] * pad,
                "seq_start_id": [0],
            }
        )
    return samples


def pretraining_corpus(n: int, seed: int) -> np.ndarray:
    """`n` pretraining documents, EOS-terminated and PAD-padded: (n, SEQ_LEN) int64.

    Web-like, not summaries: half carry their attributes as a title before the
    text, half as a trailer after an END mark in reverse order (tone, region,
    topic). The base model thus knows the attribute tokens and has some skill at
    inferring them, but has never seen the SUMMARY prompt or the summary's order."""
    grammar = Grammar()
    rng = np.random.default_rng(seed)
    out = np.full((n, SEQ_LEN), PAD, dtype=np.int64)
    for k in range(n):
        text, attributes = document(grammar, rng)
        if rng.random() < 0.5:
            ids = [BOS] + attributes + text + [EOS]
        else:
            ids = [BOS] + text + [END] + attributes[::-1] + [EOS]
        out[k, : len(ids)] = ids
    return out
