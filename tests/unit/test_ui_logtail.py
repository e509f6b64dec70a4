"""trainguard.ui.logtail: the last lines of a file, and the lines around one, read in
blocks from the end or the start, against the file's own content on any layout."""

from __future__ import annotations

import random
from pathlib import Path

from trainguard.ui import logtail


def test_tail_and_around_agree_with_the_file_on_any_layout(tmp_path: Path) -> None:
    rnd = random.Random(7)
    path = tmp_path / "x.log"
    for _ in range(200):
        lines = [("y" * rnd.choice([0, 3, 40, 60_000])) + str(i)
                 for i in range(rnd.randint(0, 40))]
        data = "\n".join(lines) + ("\n" if lines and rnd.random() < 0.7 else "")
        path.write_text(data)
        want = rnd.randint(0, 50)
        got = logtail.tail(path, want)
        expected = lines[-want:] if want else []
        assert [ln.text for ln in got.lines] == expected
        if expected:
            assert got.lines[0].n == len(lines) - len(expected) + 1
            assert data.encode()[got.start:].split(b"\n")[0].decode() == expected[0]
        if lines:
            line, context = rnd.randint(1, len(lines)), rnd.randint(0, 4)
            near = logtail.around(path, line, context)
            first = max(1, line - context)
            assert [ln.text for ln in near.lines] == lines[first - 1:line + context]
            assert near.lines[0].n == first


def test_an_empty_file_has_no_lines(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    assert logtail.tail(path, 10).lines == [] and logtail.around(path, 1, 3).lines == []


def test_a_line_without_an_end_is_read_only_up_to_the_byte_limit(tmp_path: Path) -> None:
    path = tmp_path / "one.log"
    path.write_bytes(b"x" * (logtail.MAX_BYTES + 3 * logtail.BLOCK))
    got = logtail.tail(path, 5)
    assert not got.complete and got.lines == []


def test_stamped_lines_are_split_and_others_kept_whole() -> None:
    ln = logtail.split_line("2026-03-01T12:00:00.123+00:00 err boom: it broke", 4)
    assert (ln.n, ln.time, ln.stream, ln.text) == (
        4, "2026-03-01T12:00:00.123+00:00", "err", "boom: it broke")
    assert logtail.split_line("2026-03-01T12:00:00+00:00 out ", 1).text == ""
    plain = logtail.split_line("Traceback (most recent call last):", None)
    assert (plain.time, plain.stream, plain.text) == (None, None,
                                                      "Traceback (most recent call last):")


def test_a_line_longer_than_the_writer_ever_writes_is_shown_cut(tmp_path: Path) -> None:
    path = tmp_path / "long.log"
    path.write_text("a\n" + "z" * (logtail.MAX_LINE + 10) + "\nb\n")
    long_line = logtail.tail(path, 2).lines[0]
    assert long_line.n == 2 and long_line.text.endswith(" ... (10 more bytes)")
    assert len(long_line.text) < logtail.MAX_LINE + 30
