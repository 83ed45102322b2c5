import pytest

from federation import topics
from federation.errors import Invalid


def test_topics_round_trip() -> None:
    for build, channel in ((topics.commands, "commands"), (topics.reports, "reports"),
                           (topics.presence, "presence")):
        t = topics.parse(build("worker-1"))
        assert (t.cluster, t.channel) == ("worker-1", channel)


def test_custom_root_round_trip() -> None:
    t = topics.parse(topics.reports("w2", root="fed-a/v1"), root="fed-a/v1")
    assert t.cluster == "w2"
    with pytest.raises(Invalid):
        topics.parse(topics.reports("w2", root="fed-a/v1"))


@pytest.mark.parametrize("bad", ["mkd/v1/Worker/reports", "mkd/v1/w/other", "mkd/v2/w/reports",
                                 "mkd/v1/w/reports/x", "mkd/v1/+/reports", ""])
def test_parse_refuses_foreign_topics(bad: str) -> None:
    with pytest.raises(Invalid) as err:
        topics.parse(bad)
    assert err.value.field == "topic"


def test_cluster_name_is_checked() -> None:
    with pytest.raises(Invalid, match="cluster"):
        topics.commands("bad/name")
