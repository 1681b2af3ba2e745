"""The project's own tokenizer for the tiny profile: byte-level BPE trained on simulator text.

No download: it is trained (seconds) on a corpus of rendered screens, instructions, questions and
actions from ``train``-split states (:func:`mobilerl.tinybase.data.corpus_texts`).

Pre-tokenization is where most of the learnability comes from (see ``docs/tiny_base.md``):

- every integer is split into chunks of at most 3 digits, and the corpus contains each of 0-999, so a
  coordinate on the 0-999 grid (or a line index) is exactly **one token**, the same token on the screen
  and in the answer — copying a box is copying 4 tokens;
- a line's ``Class;flags;`` prefix is one pre-token (the frequent ones become one token);
- words keep their leading space (``" story"``, ``spaces="prefix"``), so most labels are 1-3 tokens; or a
  space is a token of its own (``spaces="split"``), so a word is one id wherever it stands;
- the action syntax pieces (``do(action="``, ``", element=[``, ``", text="`` …) are pre-tokens, so an
  action costs few tokens.

Special tokens are Qwen2-VL's names (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``,
``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>``, ``<|video_pad|>``) so that
``Qwen2VLProcessor`` and the ``qwen2_vl`` LLaMA-Factory template work unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
PAD, BOS, EOS = "<|endoftext|>", "<|endoftext|>", "<|im_end|>"

# Qwen2-VL's chat template, without the default system prompt (tokens are precious on a CPU).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for c in message['content'] %}"
    "{% if c['type'] == 'image' or 'image' in c %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' or 'video' in c %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# One alternation, applied before the byte-level mapping (behaviour "isolated": matches become
# pre-tokens, the text between them too). ``{sp}`` is " ?" when words keep their leading space
# (spaces="prefix": " story" is one token) and "" when a space is a token of its own (spaces="split").
_PRETOKENIZE = (
    r"{sp}[A-Z][A-Za-z]*;[a-z -]*;",  # a compressed-XML line prefix: Class;flags;
    r'do\(action="',
    r'finish\(message="',
    r"finish\(\)",
    r'", (?:element=\[|index=|text="|app="|direction="|dist="|message=")',
    r'"\)',
    r"\]\)",
    r"\d{{1,3}}",
    r"{sp}[A-Za-z]+",
    r"{sp}[^\sA-Za-z\d]+",
    r"\s+",
)
SPACES = ("prefix", "split")


def pretokenize_pattern(spaces: str = "prefix") -> str:
    """The pre-tokenizer's regex.

    ``spaces="split"`` makes a word the same token wherever it stands: ``alarm`` in an instruction
    ("Set an alarm"), in a question (``type after "an"``) and in an action (``text="alarm"``), where
    with ``"prefix"`` the first is `` alarm`` and the others ``alarm`` — two unrelated ids the model must
    learn to equate before it can copy a span (docs/tiny_base.md measures both).
    """
    if spaces not in SPACES:
        raise ValueError(f"spaces must be one of {SPACES}, got {spaces!r}")
    sp = " ?" if spaces == "prefix" else ""
    return "|".join(x.format(sp=sp) for x in _PRETOKENIZE)


def _number_merges() -> tuple[list[str], list[tuple[str, str]]]:
    """Vocabulary and merges that make every 1-3 digit string one token, whatever the merge order.

    Digit runs are their own pre-tokens (chunks of ≤ 3 digits), so these merges never interact with the
    learned ones. A 3-digit string can be reached from either split ("25"+"4" or "2"+"54"), so both
    merges are added.
    """
    two = [f"{a}{b}" for a in "0123456789" for b in "0123456789"]
    three = [f"{a}{b}" for a in "0123456789" for b in two]
    merges = [(t[0], t[1]) for t in two]
    for t in three:
        merges += [(t[:2], t[2]), (t[0], t[1:])]
    return two + three, merges


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2, spaces: str = "prefix"):
    """Train the byte-level BPE and wrap it in a ``PreTrainedTokenizerFast`` with the chat template.

    BPE is learned on the text with digits blanked out; then every 1-3 digit string is added as one
    token (:func:`_number_merges`); the final vocabulary has (at most) ``vocab_size`` entries.
    """
    import json
    import re

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    digits = re.compile(r"\d")
    number_vocab, number_merges = _number_merges()
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pretokenize_pattern(spaces)), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    learned = vocab_size - len(number_vocab)
    if learned < 512:
        raise ValueError(f"vocab_size {vocab_size} too small: the numbers 0-999 alone take {len(number_vocab)}")
    trainer = trainers.BpeTrainer(
        vocab_size=learned,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator((digits.sub("0", t) for t in texts), trainer=trainer)
    spec = json.loads(tk.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["model"]["merges"]]
    # Drop what BPE learned on the blanked digits ("00", "000"), then add the full digit vocabulary.
    merges = [m for m in merges if not (m[0] + m[1]).isdigit()]
    kept = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if not (len(t) > 1 and t.isdigit())]
    tokens = kept + [t for t in number_vocab if t not in set(kept)]
    spec["model"]["vocab"] = {t: i for i, t in enumerate(tokens)}
    spec["model"]["merges"] = [list(m) for m in number_merges + merges]
    return wrap(Tokenizer.from_str(json.dumps(spec)))


def wrap(tk):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (PAD, EOS)],
        model_max_length=32768,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def single_token_numbers(tok, upto: int = 1000) -> list[int]:
    """The integers below ``upto`` that are *not* one token (should be empty)."""
    bad = []
    for i in range(upto):
        if len(tok(str(i), add_special_tokens=False)["input_ids"]) != 1:
            bad.append(i)
    return bad
