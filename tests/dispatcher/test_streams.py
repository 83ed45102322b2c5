"""StreamBook: loss on an agent's report stream is told apart from reordering and repeats."""

from __future__ import annotations

from dispatcher.wire.streams import StreamBook


def test_in_order_reordered_and_repeated_reports_are_no_loss() -> None:
    book = StreamBook(grace=5)
    assert not book.seen("w1", "s1", 1, now=0)
    for n in (2, 4, 3, 3, 5, 1):  # 4 before 3, then repeats
        assert not book.seen("w1", "s1", n, now=1)
    assert book.overdue(now=100) == []


def test_a_hole_that_stays_open_past_grace_is_a_loss_once() -> None:
    book = StreamBook(grace=5)
    for n in (1, 2, 4, 5):  # 3 was dropped by the broker
        book.seen("w1", "s1", n, now=10)
    assert book.overdue(now=14) == []
    assert book.overdue(now=15) == ["w1"]
    assert book.overdue(now=30) == []  # forgiven: the Resync covers it
    assert not book.seen("w1", "s1", 6, now=31)
    assert book.overdue(now=60) == [] and book.lost_holes == 1


def test_a_trailing_loss_shows_when_the_next_heartbeat_arrives() -> None:
    book = StreamBook(grace=5)
    book.seen("w1", "s1", 1, now=0)
    # reports 2..9 dropped; the heartbeat 10 s later carries n=10
    book.seen("w1", "s1", 10, now=10)
    assert book.overdue(now=15) == ["w1"]


def test_a_stream_met_part_way_needs_a_resync_and_a_new_link_from_one_does_not() -> None:
    book = StreamBook()
    assert book.seen("w1", "s1", 7, now=0)  # the dispatcher joined late: what came before is unknown
    assert not book.seen("w2", "s2", 1, now=0)
    assert not book.seen("w2", "s3", 1, now=1)  # the agent reconnected: a fresh stream
    book.forget()
    assert book.seen("w2", "s3", 2, now=2)


def test_unnumbered_reports_are_not_tracked() -> None:
    book = StreamBook()
    assert not book.seen("w1", "", 0, now=0)
    assert not book.seen("w1", "s1", 0, now=0)
    assert book.overdue(now=100) == []


def test_clusters_are_independent() -> None:
    book = StreamBook(grace=1)
    book.seen("w1", "a", 1, now=0)
    book.seen("w1", "a", 3, now=0)
    book.seen("w2", "b", 1, now=0)
    book.seen("w2", "b", 2, now=0)
    assert book.overdue(now=2) == ["w1"]
