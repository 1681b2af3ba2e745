from pathlib import Path

import pytest

from mobilerl.env.xml import compress_nodes, compress_xml, parse_dump

FIXTURES = Path(__file__).parent / "fixtures"
DUMP = (FIXTURES / "device_settings_dump.xml").read_text()
# Every attribute `uiautomator dump` writes on each node (AccessibilityNodeInfoDumper); NAF only when true.
UIAUTOMATOR_ATTRS = {"index", "text", "resource-id", "class", "package", "content-desc", "checkable", "checked",
                     "clickable", "enabled", "focusable", "focused", "scrollable", "long-clickable", "password",
                     "selected", "bounds"}


def test_paper_example_node():
    xml = (
        '<hierarchy rotation="0"><node index="0" text="Audio Recorder" '
        'resource-id="com.dimowner.audiorecorder:id/txt_title" class="android.widget.TextView" '
        'package="com.dimowner.audiorecorder" content-desc="" checkable="false" checked="false" '
        'clickable="false" enabled="true" focusable="false" focused="false" scrollable="false" '
        'long-clickable="false" password="false" selected="false" bounds="[221,1095][858,1222]" /></hierarchy>'
    )
    assert compress_xml(xml, width=1080, height=2400) == "TextView;;Audio Recorder;[221,1095][858,1222]"


def test_real_device_dump():
    lines = compress_xml(DUMP).splitlines()
    assert "ImageButton;clickable focusable;Navigate up;[0,157][126,283]" in lines
    assert "TextView;;Network & internet;[164,186][657,254]" in lines
    assert "RecyclerView;focusable scrollable;;[0,304][1080,2337]" in lines
    assert "Switch;checkable checked;;[891,566][1017,651]" in lines
    assert "TextView;clickable;Private DNS\\nAutomatic;[0,1000][1080,1100]" in lines  # one line per node
    assert "TextView;;Wi-Fi hotspot;[0,1100][1080,1200]" in lines  # a content-desc is a label
    assert "TextView;;4:12;[66,38][150,98]" in lines  # second window (system UI) kept
    text = "\n".join(lines)
    # layout-only containers and package/resource-id/index are gone
    assert "FrameLayout" not in text and "resource-id" not in text and "android:id" not in text
    # off-screen: below the screen, a row sticking out of its scrolling parent, and its child, which lies
    # outside the nearest kept ancestor (the list) too
    assert "Data Saver" not in text and "VPN" not in text
    assert "Share" not in text  # zero-area node
    for line in lines:
        assert line.count(";") >= 3 and line.endswith("]")


def test_keep_offscreen_and_numbered():
    kept = compress_xml(DUMP, keep_offscreen=True)
    assert "Data Saver" in kept and "VPN" in kept
    numbered = compress_xml(DUMP, numbered=True).splitlines()
    assert numbered[0].startswith("[0] ") and numbered[1].startswith("[1] ")
    nodes = compress_nodes(DUMP)
    assert len(nodes) == len(numbered)
    assert nodes[0].bounds == (0, 157, 126, 283)


def test_both_text_and_desc():
    xml = (
        '<hierarchy><node class="android.widget.Button" text="Share" content-desc="Share Wi-Fi" '
        'clickable="true" bounds="[0,0][100,100]"/></hierarchy>'
    )
    assert compress_xml(xml, width=1080, height=2400) == "Button;clickable;Share | Share Wi-Fi;[0,0][100,100]"


def test_malformed_dump_is_a_clear_error():
    with pytest.raises(ValueError, match="malformed UI dump"):
        compress_xml("<hierarchy><node bounds=")
    with pytest.raises(ValueError, match="empty"):
        compress_xml("   ")


def test_a_repeated_dump_is_compressed_once_and_a_bad_one_raises_every_time():
    compress_xml.cache_clear()
    first = compress_xml(DUMP, width=1080, height=2400)
    again = compress_xml("".join(DUMP), width=1080, height=2400)  # an equal string, not the same object
    assert again == first and compress_xml.cache_info().hits == 1
    assert compress_xml(DUMP, numbered=True, width=1080, height=2400) != first  # other arguments, other entry
    for _ in range(2):  # errors are not memoised
        with pytest.raises(ValueError, match="malformed UI dump"):
            compress_xml("<hierarchy><node bounds=")


def test_missing_attributes_count_as_false():
    xml = '<hierarchy><node class="android.widget.TextView" text="Hi" bounds="[0,0][100,100]"/></hierarchy>'
    assert compress_xml(xml, width=1080, height=2400) == "TextView;;Hi;[0,0][100,100]"


def test_an_overhanging_node_takes_only_itself_away():
    """Two chat bubbles whose containers overhang their rows stay visible, as in AndroidLab and MobileRL."""
    # observed: THUDM/MobileRL android_lab/utils_mobile/xml_tool_v2.py (UIXMLTree.process, level=1) on this
    # fixture keeps the same 13 labelled/functional message-list nodes, the two bubbles included
    lines = compress_xml((FIXTURES / "messages_chat_dump.xml").read_text()).splitlines()
    assert "TextView;focusable long-clickable;Yes! See you at 7 at Luigi's;[300,664][998,760]" in lines
    assert "TextView;focusable long-clickable;Great, I booked a table for two;[82,884][780,980]" in lines
    assert "TextView;;18:05;[300,764][460,810]" in lines and "TextView;;18:06;[82,984][242,1030]" in lines
    assert len(lines) == 17 and not any("FrameLayout" in t or "ViewGroup" in t for t in lines)


def test_children_are_judged_against_the_nearest_kept_ancestor():
    def node(b: str, kids: str = "", **a: str) -> str:
        attrs = " ".join(f'{k.replace("_", "-")}="{v}"' for k, v in a.items())
        return f'<node class="android.view.View" {attrs} bounds="{b}">{kids}</node>'
    # a layout-only box that its child overhangs is no reference: the child lies inside the kept list
    inner = node("[0,100][500,300]", node("[0,50][500,350]", text="in list"))
    xml = f"<hierarchy>{node('[0,0][1080,1000]', inner, scrollable='true')}</hierarchy>"
    assert compress_xml(xml, width=1080, height=2400).splitlines()[1] == "View;;in list;[0,50][500,350]"
    # a child outside the nearest kept ancestor is dropped even when its own (dropped) parent holds it
    out = node("[0,900][1080,1200]", node("[0,950][500,1100]", text="below the list"))
    xml = f"<hierarchy>{node('[0,0][1080,1000]', out, scrollable='true')}</hierarchy>"
    assert "below the list" not in compress_xml(xml, width=1080, height=2400)


@pytest.mark.parametrize("name", ["device_settings_dump.xml", "messages_chat_dump.xml", "adb/window_dump.xml"])
def test_fixture_dumps_carry_every_attribute_uiautomator_writes(name):
    nodes = list(parse_dump((FIXTURES / name).read_text()).iter("node"))
    assert nodes and all(set(n.attrib) >= UIAUTOMATOR_ATTRS for n in nodes)


def test_simulator_dumps_carry_every_attribute_uiautomator_writes():
    from mobilerl.env.sim.env import SimEnv
    from mobilerl.env.sim.tasks.registry import get_task

    obs = SimEnv(render=False, perturb="none").reset(get_task("world/train/ContactsDeleteContact/0",
                                                             with_optimal=False))
    root = parse_dump(obs.xml)
    assert root.get("rotation") == "0"
    assert all(set(n.attrib) == UIAUTOMATOR_ATTRS for n in root.iter("node"))
