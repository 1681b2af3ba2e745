from pathlib import Path

import pytest

from mobilerl.env.xml import compress_nodes, compress_xml

DUMP = (Path(__file__).parent / "fixtures" / "device_settings_dump.xml").read_text()


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
    assert "TextView;;Wi-Fi hotspot;[0,1100][1080,1200]" in lines  # missing attributes tolerated
    assert "TextView;;4:12;[66,38][150,98]" in lines  # second window (system UI) kept
    text = "\n".join(lines)
    # layout-only containers and package/resource-id/index are gone
    assert "FrameLayout" not in text and "resource-id" not in text and "android:id" not in text
    # off-screen: below the screen, and a row sticking out of its scrolling parent (with its child)
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
