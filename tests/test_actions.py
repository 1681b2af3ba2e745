import json
from pathlib import Path

import pytest

from mobilerl.env.actions import (
    Action,
    ActionParseError,
    convert_action,
    format_action,
    parse_action,
    to_absolute,
    to_relative,
)

ROUND_TRIP = [
    Action("Tap", element=(10, 20, 300, 400)),
    Action("Long Press", element=(0, 0, 1080, 2400)),
    Action("Type", text='He said "hi"\\ and left\nnew line'),
    Action("Swipe", direction="up", dist="long"),
    Action("Swipe", direction="left", dist="short", element=(0, 500, 1080, 900)),
    Action("Launch", app="Simple Calendar Pro"),
    Action("Back"),
    Action("Home"),
    Action("Wait"),
    Action("Finish", message="The answer is 42."),
    Action("Finish"),
    Action("Enter"),
    Action("Type", text="C:\\x it's", clear=True),
    Action("Swipe", start=(540, 1800), end=(540, 600)),
    Action("Swipe", start=(100, 900), end=(900, 950), direction="right", dist="long"),
]


@pytest.mark.parametrize("action", ROUND_TRIP, ids=lambda a: a.name)
def test_round_trip(action):
    assert parse_action(format_action(action)) == action


def test_full_response_and_variants():
    text = "<think>The Save button is at the top.</think>\n<answer>do(action='Tap', element=[944, 108, 1064, 228])</answer>"
    assert parse_action(text) == Action("Tap", element=(944, 108, 1064, 228))
    assert parse_action('finish(message="done")').message == "done"
    assert parse_action("<think>x</think> do(action=\"Back\")").name == "Back"
    assert parse_action('do(action="Swipe", direction="down")').dist == "medium"
    assert parse_action('do(action="long_press", element=[1,2,3,4])').name == "Long Press"
    assert parse_action('do(action="Finish", message="ok")') == Action("Finish", message="ok")
    assert parse_action("```\ndo(action=\"Home\")\n```").name == "Home"


@pytest.mark.parametrize(
    "written, text",
    [
        (r'do(action="Type", text="+1 312 555-\2- 0")', "+1 312 555-\\2- 0"),  # was U+0002 (Python's octal)
        (r'do(action="Type", text="C:\x")', "C:\\x"),  # was a SyntaxError (a truncated \x escape)
        (r'do(action="Type", text="tab\there \u00e9")', "tab\\there \\u00e9"),
        (r'do(action="Type", text="a\\b \"q\" \n")', 'a\\b "q" \n'),  # the escapes format_action writes
        (r"do(action='Type', text='it\'s')", "it's"),
        (r'do(action="Type", text=r"raw\2\"")', 'raw\\2\\"'),
    ],
)
def test_backslashes_follow_the_grammar_format_action_writes(written, text):
    """Only \\, \", \' and \n are escapes in an action's string; other backslashes are typed as written."""
    a = parse_action(written)
    assert a.text == text
    assert all(c == "\n" or c >= " " for c in a.text)
    assert parse_action(format_action(a)) == a


@pytest.mark.parametrize(
    "bad, why",
    [
        ("", "empty"),
        ("tap the button", "no do"),
        ('do(action="Tap")', "needs argument"),
        ('do(action="Tap", element=[1,2,3])', "4 integers"),
        ('do(action="Tap", element=[5,5,1,1])', "x1<=x2"),
        ('do(action="Tap", element=[1.5,2,3,4])', "integer"),
        ('do(action="Fly", element=[1,2,3,4])', "unknown action"),
        ('do(action="Swipe", direction="sideways")', "direction"),
        ('do(action="Type", text=__import__("os").system("rm -rf /"))', "literals"),
        ('do(action="Type", text="a") + do(action="Back")', "exactly one"),
        ('do(action="Back", extra="x")', "unexpected"),
        ("do(action=\"Back\")</answer>", "unterminated"),
        ('do(action="Tap", element=[1,2,3,4], element=[1,2,3,4])', "twice"),
        ('do("Tap")', "keyword"),
        ("finish(message=1)", "string"),
        ('open(action="Back")', "no do"),
        ('do(action="Tap", element=[1,2,3,4]', "malformed"),
    ],
)
def test_malformed_is_a_clear_error(bad, why):
    with pytest.raises(ActionParseError) as e:
        parse_action(bad)
    assert why.lower() in str(e.value).lower()
    assert isinstance(e.value, ValueError)


def test_relative_grid_conversion():
    box = (221, 1095, 858, 1222)
    rel = to_relative(box, 1080, 2400)
    assert all(0 <= v <= 999 for v in rel)
    back = to_absolute(rel, 1080, 2400)
    assert all(abs(a - b) <= 2 for a, b in zip(back, box, strict=True))
    assert to_relative((0, 0, 1080, 2400), 1080, 2400) == (0, 0, 999, 999)
    with pytest.raises(ActionParseError):
        to_absolute((0, 0, 1000, 5), 1080, 2400)
    a = convert_action(Action("Tap", element=box), 1080, 2400, "relative")
    assert a.element == rel and convert_action(Action("Back"), 1080, 2400, "relative") == Action("Back")


def test_index_actions_parse_format_and_reject_ambiguity():
    from mobilerl.env.actions import Action, ActionParseError, format_action, parse_action

    a = parse_action('<think>the switch</think><answer>do(action="Tap", index=7)</answer>')
    assert a == Action("Tap", index=7) and a.element is None and a.center is None
    assert parse_action(format_action(a)) == a and Action.from_dict(a.to_dict()) == a
    assert "index" not in parse_action('do(action="Tap", element=[1,2,3,4])').to_dict()  # old records unchanged
    for bad, why in [('do(action="Tap", index=1, element=[1,2,3,4])', "not both"),
                     ('do(action="Tap", index="3")', "integer"), ('do(action="Tap", index=-1)', "index"),
                     ('do(action="Type", text="a", index=2)', "unexpected")]:
        with pytest.raises(ActionParseError, match=why):
            parse_action(bad)


# android_lab/evaluation/utils.py (extract_think_ans), evaluation.py (two-point elements, clear=True),
# page_executor/text_executor.py (leading zeros, "Press Back", "Enter", v4 quoting, start=/end=) in
# THUDM/MobileRL; evaluation/definition.py (get_code_snippet) and page_executor/text_executor.py
# ("Action:" lines) in THUDM/Android-Lab. Each pair: a response those harnesses execute -> what they do.
HARNESS_ACCEPTS = [
    ('<think>open it</think>\n<ans>\ndo(action="Launch", app="Files")\n</ans>\n\n', Action("Launch", app="Files")),
    ('<think>t</think>\n<ans>do(action="Home")', Action("Home")),  # unterminated <ans>
    ('<think>t</think>\n<answer>do(action="Back")', Action("Back")),  # unterminated <answer>
    ('<answer>do(action="Tap", element=[500, 300])</answer>', Action("Tap", element=(500, 300, 500, 300))),
    ('do(action="Long Press", element=[012, 0450, 0300, 0999])', Action("Long Press", element=(12, 450, 300, 999))),
    ('do(action="Tap", index=07)', Action("Tap", index=7)),
    ('do(action="Type", text="007")', Action("Type", text="007")),  # strings keep their zeros
    ('do(action="Enter")', Action("Enter")),
    ('do(action="Press Back")', Action("Back")),
    ('do(action="Type", text="Paris", clear=True)', Action("Type", text="Paris", clear=True)),
    ('do(action="Swipe", start=[540, 1800], end=[540, 600])', Action("Swipe", start=(540, 1800), end=(540, 600))),
    ('* Analysis: the alarm.\n* Plan:\nOpen Clock.\n* Operation:\n\n```\ndo(action="Launch", app="Clock")\n```\n',
     Action("Launch", app="Clock")),
    ('```\n# tap the field\ndo(action="Tap", element=[1, 2, 3, 4])\n```', Action("Tap", element=(1, 2, 3, 4))),
    ('Thought: the list ends here.\nAction: do(action="Swipe", direction="up", dist="long")',
     Action("Swipe", direction="up", dist="long")),
    ('Action: finish(message="done")', Action("Finish", message="done")),
    ('<ans>do(action="Type", text="Next Action: go")</ans>', Action("Type", text="Next Action: go")),
    ('do(action="Type", text="say "hi" now")', Action("Type", text='say "hi" now')),
    ('<answer>finish(message="The "Work" list")</answer>', Action("Finish", message='The "Work" list')),
    ('do(action="Type", text="line one\nline two")', Action("Type", text="line one\nline two")),  # raw newline
]


@pytest.mark.parametrize("text, action", HARNESS_ACCEPTS)
def test_accepts_what_the_official_harnesses_execute(text, action):
    assert parse_action(text) == action
    assert parse_action(format_action(action)) == action


@pytest.mark.parametrize(
    "bad, why",
    [
        ('<ans>do(action="Type", text=__import__("os").system("id"))</ans>', "malformed"),
        ('Action: __import__("os").system("id")', "no do"),
        ('```\nimport os; do(action="Back")\n```', "malformed"),
        ('<ans>do(action="Tap", element=[1, 2, 3]</ans>', "malformed"),
        ('do(action="Tap", element=[1, 2, 3])', "4 integers"),
        ('do(action="Swipe", start=[1, 2])', "direction"),
        ('do(action="Swipe", start=[5, 5], end=[5, 5])', "distinct"),
        ('do(action="Swipe", start=[1, 2, 3], end=[4, 5])', "point"),
        ('do(action="Type", text="a", clear="yes")', "clear"),
        ('do(action="Back", clear=True)', "unexpected"),
        ('do(action="Press Home")', "unknown action"),  # not in MobileRL's executor's list either
        ('<think>t</think><answer>do(action="Type", text="a") b")</answer>', "malformed"),
    ],
)
def test_harness_reading_still_rejects_unsafe_or_malformed_text(bad, why):
    with pytest.raises(ActionParseError, match=why):
        parse_action(bad)


# What MobileRL's v4 executor (android_lab/page_executor/text_executor.py) calls do()/finish() with, run on
# format_action's output: its re.sub rewrite of text="…") broke the old "C:\\x" (SyntaxError).
MOBILERL_READS = [
    (Action("Type", text='say "hi"'), """do(action="Type", text='say "hi"')"""),
    (Action("Type", text="C:\\x\\n"), r"""do(action="Type", text='C:\\x\\n')"""),
    (Action("Finish", message="it's \"x\"\\"), r"""finish(message='it\'s "x"\\')"""),
    (Action("Finish", message="a\nb"), r'finish(message="a\nb")'),
    (Action("Type", text="it's"), """do(action="Type", text="it's")"""),
]


@pytest.mark.parametrize("action, written", MOBILERL_READS)
def test_format_action_writes_what_mobilerl_reads_back(action, written):
    assert format_action(action) == written
    assert parse_action(written) == action


def test_previously_accepted_responses_parse_as_before():
    """Responses the parser accepted before the harness reading (recorded eval/SFT outputs and format_action
    variants of every action kind) still parse to the same action."""
    rows = [json.loads(line) for line in (Path(__file__).parent / "fixtures" / "parse_corpus.jsonl").open()]
    assert len(rows) > 300
    changed = [r["text"] for r in rows if parse_action(r["text"]).to_dict() != r["action"]]
    assert changed == []


def test_new_fields_stay_out_of_old_records_and_convert_with_the_grid():
    assert set(Action("Type", text="a").to_dict()) == {"name", "element", "text", "app", "direction", "dist", "message"}
    swipe = Action("Swipe", start=(540, 2000), end=(540, 400))
    assert swipe.direction == "up" and Action.from_dict(swipe.to_dict()) == swipe
    rel = convert_action(swipe, 1080, 2400, "relative")
    assert (rel.start, rel.end) == ((500, 833), (500, 167))
    typed = Action("Type", text="x", clear=True)
    assert typed.to_dict()["clear"] is True and Action.from_dict(typed.to_dict()) == typed


# A security probe's findings: nesting that overflowed ast's recursion (RecursionError / MemoryError), a literal
# past int's digit limit (ValueError), and lazy regexes that took seconds on an unclosed fence or tag.
PROBE_INPUTS = [
    "do(action=" + "-" * 2982 + "1)",
    'do(action="Tap", element=[' + "+".join(["1"] * 3000) + "])",
    'do(action="Tap")' + "()" * 3000,
    'do(action="Tap")' + "[0]" * 3000,
    "do(action=" + "(" * 5000 + "1" + ")" * 5000 + ")",
    "do(action=" + "not " * 3000 + "1)",
    "do(action=a" + ".a" * 5000 + ")",
    'do(action=f"{' + "1+" * 3000 + '1}")',
    'do(action="Tap", element=[0x' + "f" * 3572 + ", 1, 2, 3])",
    'do(action="Tap", element=[' + "9" * 5000 + ", 1, 2, 3])",
    "```" + "a" * 32_000,
    "<answer>" * 4000,
    "<ans>```" + "b" * 32_000,
    'text="' * 4600,
    "do(" + " " * 32_000 + "x",
    'do(action="Type", text="' + '", ' * 10_000,
    "do(action=\"Back\")\x00",
    'do(action="Type", text="\ud800")',
]
_FUZZ_PIECES = ["(", ")", "[", "]", "{", "}", '"', "'", '"""', "'''", "\\", "+", "-", "*", "**", ".", ":", ",",
                "=", ";", "#", "not ", " if ", " else ", "lambda:", " and ", "```", "```python\n", "<answer>",
                "</answer>", "<ans>", "</ans>", "<think>", "</think>", "Action: ", "do(", "finish(", "action=",
                '"Tap"', "element=[", "text=", 'text="', "message=", "0x", "0", "1_0", "1e9", "٣", "\n", " ",
                "\t", "é", "🙂", "\u202e", "\ud800", "\x00", 'f"{', 'r"', "rb'", 'do(action="Back")',
                'do(action="Tap", element=[1, 2, 3, 4])']


def _fuzz_inputs(count: int) -> list[str]:
    """PROBE_INPUTS and random mixtures of the pieces above: short ones, and runs of one piece repeated up to
    the length cap."""
    import random

    rng = random.Random(20_240_601)
    out = list(PROBE_INPUTS)
    while len(out) < count:
        parts: list[str] = []
        for _ in range(rng.randint(1, 12)):
            piece = rng.choice(_FUZZ_PIECES)
            if piece == "0":
                piece = "".join(rng.choice("0123456789abcdef_") for _ in range(rng.choice((1, 40, 5000))))
            reps = rng.choice((1, 1, 1, 2, 5, 50, 500, 3000))
            parts.append(piece * reps)
        out.append("".join(parts)[:32_768])
    return out


@pytest.mark.timeout(600)
def test_adversarial_inputs_parse_or_raise_action_parse_error_fast():
    """10,000 adversarial responses: each parses or raises ActionParseError (nothing else) within 50 ms. A slow
    first measurement is retried four times (best of five), so a scheduler pause on a shared CPU is not a
    failure; an input that is slow to parse is slow every time."""
    import gc
    import time

    inputs = _fuzz_inputs(10_000)
    assert len(inputs) == 10_000
    others: list[str] = []

    def timed(text: str) -> float:
        t0 = time.perf_counter()
        try:
            parse_action(text)
        except ActionParseError:
            pass
        except Exception as e:  # noqa: BLE001 - the point of the test
            others.append(f"{type(e).__name__} on {text[:60]!r}")
        return time.perf_counter() - t0

    gc.disable()
    try:
        times = []
        for text in inputs:
            t = timed(text)
            if t > 0.05:
                t = min(t, *(timed(text) for _ in range(4)))
            times.append((t, text))
    finally:
        gc.enable()
    slowest, text = max(times)
    print(f"slowest adversarial parse: {slowest * 1000:.1f} ms ({len(text)} chars: {text[:40]!r})")
    assert others == []
    assert slowest <= 0.05, (slowest, text[:80])


def test_bounded_nesting_and_literals_are_action_parse_errors():
    for text, why in [(PROBE_INPUTS[0], "operators"), (PROBE_INPUTS[4], "nested"), (PROBE_INPUTS[7], "f-strings"),
                      (PROBE_INPUTS[8], "numeric literal")]:
        with pytest.raises(ActionParseError, match=why):
            parse_action(text)
    # the bounds leave real actions alone
    assert parse_action('do(action="Swipe", start=[540, 1800], end=[540, 600])').start == (540, 1800)
    assert parse_action('do(action="Type", text="' + "(+-" * 5000 + '")').text == "(+-" * 5000
