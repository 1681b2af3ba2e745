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
        ("<answer>do(action=\"Back\")", "unterminated"),
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
