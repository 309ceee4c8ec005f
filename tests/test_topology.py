"""Topologies: the shipped files, the default, the link model by hand, and every validation error."""

import textwrap

import pytest

from geodml.comm.topology import (
    DEFAULT_LAN,
    TOPOLOGY_DIR,
    Topology,
    TopologyError,
    WanLink,
    default_topology,
    load_topology,
    rank_links,
    shipped_topologies,
    topology_from_dict,
)


def write(tmp_path, text, name="t.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


TWO = """
    source = "illustrative"
    regions = ["us", "eu"]
    placement = "cyclic"
    [default]
    bandwidth_mbps = 100
    latency_ms = 40
"""


# ---- the link model -------------------------------------------------------------------
def test_transfer_s_by_hand():
    # 1,000,000 B over 80 Mbit/s = 8e6 bit / 8e7 bit/s = 0.1 s, plus 25 ms latency
    assert WanLink(bandwidth_mbps=80, latency_ms=25).transfer_s(1_000_000) == pytest.approx(0.125, rel=1e-12)
    assert WanLink(bandwidth_mbps=80, latency_ms=25).transfer_s(0) == pytest.approx(0.025)
    assert WanLink(100, 0).bytes_per_s == 12_500_000


def test_wan_scale_scales_bandwidth_not_latency():
    t = load_topology("five-continents").scaled(10)
    link = t.link("africa", "europe")
    assert link == WanLink(bandwidth_mbps=1000, latency_ms=79.5)
    assert t.link("asia", "asia") == WanLink(bandwidth_mbps=100_000, latency_ms=1.0)
    assert t.to_dict()["bandwidth_scale"] == 10
    with pytest.raises(TopologyError, match="wan-scale"):
        t.scaled(0)


# ---- shipped topologies -----------------------------------------------------------------
def test_shipped_topologies_load_and_cite_a_source():
    names = shipped_topologies()
    assert {"lan", "five-continents", "ibm-cloud"} <= set(names)
    for name in names:
        t = load_topology(name)
        assert t.source and t.path == str(TOPOLOGY_DIR / f"{name}.toml")
        regions = t.placement(len(t.regions))
        for a in regions:
            for b in regions:
                assert t.link(a, b).bandwidth_mbps > 0


def test_five_continents_one_partition_per_continent_directed_links():
    t = load_topology("five-continents")
    assert t.placement(5) == ["africa", "americas", "asia", "europe", "oceania"]
    assert "cloudping" in t.source and "illustrative" in t.source
    # cloudping round trips: af-south-1 -> ap-northeast-1 353 ms, back 358 ms (halved, directed)
    assert t.link("africa", "asia") == WanLink(100, 176.5)
    assert t.link("asia", "africa") == WanLink(100, 179)
    assert t.link("americas", "asia") == t.link("asia", "americas") == WanLink(100, 73)
    with pytest.raises(TopologyError, match="lists 5 ranks but the run has 6.*cyclic"):
        t.placement(6)


def test_ibm_cloud_latencies_from_the_cited_table():
    t = load_topology("ibm-cloud")
    assert "IBM Cloud" in t.source and "network-latency" in t.source
    assert len(t.regions) == 10 and len(t.links) == 90  # every ordered pair listed
    assert t.link("frankfurt", "london").latency_ms == 6  # 12 ms round trip
    assert t.link("dallas", "tokyo").latency_ms == 71 and t.link("tokyo", "dallas").latency_ms == 70.5  # 142 / 141
    assert t.placement(12)[10:] == ["dallas", "toronto"]  # cyclic


def test_lan_topology_has_no_wan():
    t = load_topology("lan")
    assert t.placement(4) == ["dc"] * 4
    assert t.link("dc", "dc") == WanLink(10_000, 0.1)


def test_default_topology_one_region_per_rank():
    t = load_topology(None)
    assert t == default_topology()
    assert t.placement(3) == ["dc0", "dc1", "dc2"]
    assert t.link("dc0", "dc2") == WanLink(100, 50)
    assert t.link("dc7", "dc7") == DEFAULT_LAN
    with pytest.raises(TopologyError, match="unknown region 'us'"):
        t.link("dc0", "us")


def test_rank_links_by_region_and_lazily():
    t = load_topology("ibm-cloud")
    regions = t.placement(12)                                     # cyclic: ranks 10, 11 in dallas, toronto
    links = rank_links(t, regions)
    assert len(links) == 12 and len(links[3]) == 12
    assert links[0][10] == t.link("dallas", "dallas") == t.lan    # two ranks in one region: its LAN
    assert links[2][0] == t.link(regions[2], "dallas") and links[5][5] is None
    assert len(links._pairs) == 2                                 # only the pairs asked for are looked up
    # 10,000 partitions in the default topology's one region each: no ranks^2 table is built
    big = rank_links(default_topology(), default_topology().placement(10_000))
    assert big[9_999][0] == WanLink(100, 50) and len(big._pairs) == 1
    with pytest.raises(IndexError):
        big[10_000]


def test_path_and_bare_name(tmp_path):
    p = write(tmp_path, TWO, "mine.toml")
    t = load_topology(p)
    assert t.name == "mine" and t.placement(3) == ["us", "eu", "us"]
    assert t.link("us", "eu") == WanLink(100, 40) and t.link("eu", "eu") == DEFAULT_LAN
    assert isinstance(t, Topology)


def test_symmetric_directed_and_inherited_fields(tmp_path):
    t = load_topology(write(tmp_path, """
    source = "illustrative"
    regions = ["us", "eu", "asia"]
    [default]
    bandwidth_mbps = 100
    latency_ms = 40
    [[links]]
    between = ["us", "eu"]
    latency_ms = 30
    [[links]]
    from = "asia"
    to = "us"
    bandwidth_mbps = 50
    """))
    assert t.link("us", "eu") == t.link("eu", "us") == WanLink(100, 30)  # bandwidth from [default]
    assert t.link("asia", "us") == WanLink(50, 40)  # directed; latency from [default]
    assert t.link("us", "asia") == WanLink(100, 40)  # unlisted: the default


# ---- validation errors ----------------------------------------------------------------
def err(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(TopologyError) as e:
        load_topology(path)
    assert path in str(e.value)  # every message names the file
    return str(e.value)


def test_unknown_region_in_link(tmp_path):
    msg = err(tmp_path, TWO + """
    [[links]]
    between = ["us", "asia"]
    latency_ms = 1
    """)
    assert "links[0].between: unknown region 'asia'" in msg and "us, eu" in msg


def test_unknown_region_in_placement(tmp_path):
    msg = err(tmp_path, TWO.replace('placement = "cyclic"', 'placement = ["us", "mars"]'))
    assert "placement[1]: unknown region 'mars'" in msg


def test_unknown_region_in_link_query():
    t = topology_from_dict({"source": "x", "regions": ["us", "eu"], "default": {"bandwidth_mbps": 1, "latency_ms": 1}})
    with pytest.raises(TopologyError, match="unknown region 'moon'"):
        t.link("us", "moon")


@pytest.mark.parametrize("bw", [0, -5])
def test_non_positive_bandwidth(tmp_path, bw):
    msg = err(tmp_path, TWO.replace("bandwidth_mbps = 100", f"bandwidth_mbps = {bw}"))
    assert "[default].bandwidth_mbps must be > 0" in msg and "non-positive bandwidth" in msg


def test_non_positive_bandwidth_in_a_link(tmp_path):
    msg = err(tmp_path, TWO + """
    [[links]]
    from = "us"
    to = "eu"
    bandwidth_mbps = 0.0
    """)
    assert "links[0].bandwidth_mbps must be > 0" in msg


def test_negative_latency(tmp_path):
    msg = err(tmp_path, TWO + """
    [lan]
    bandwidth_mbps = 1000
    latency_ms = -0.5
    """)
    assert "[lan].latency_ms must be >= 0 (negative latency)" in msg


def test_non_numeric_value(tmp_path):
    assert "must be a finite number" in err(tmp_path, TWO.replace("latency_ms = 40", 'latency_ms = "fast"'))


def test_more_ranks_than_the_placement_maps(tmp_path):
    t = load_topology(write(tmp_path, TWO.replace('placement = "cyclic"', 'placement = ["us", "eu", "eu"]')))
    assert t.placement(2) == ["us", "eu"]
    with pytest.raises(TopologyError) as e:
        t.placement(4)
    msg = str(e.value)
    assert "lists 3 ranks but the run has 4" in msg
    assert "run at most 3 processes" in msg and "placement = \"cyclic\"" in msg and "t.toml" in msg


@pytest.mark.parametrize("links", [
    # directed twice
    '[[links]]\nfrom = "us"\nto = "eu"\nlatency_ms = 1\n[[links]]\nfrom = "us"\nto = "eu"\nlatency_ms = 2\n',
    # symmetric, both orders
    '[[links]]\nbetween = ["us", "eu"]\n[[links]]\nbetween = ["eu", "us"]\n',
    # symmetric plus directed
    '[[links]]\nbetween = ["us", "eu"]\n[[links]]\nfrom = "eu"\nto = "us"\n',
])
def test_duplicate_links(tmp_path, links):
    msg = err(tmp_path, TWO + "\n" + links)
    assert "duplicate link" in msg and "links[0]" in msg and "links[1]" in msg


def test_link_to_itself(tmp_path):
    assert "set by [lan]" in err(tmp_path, TWO + '\n[[links]]\nbetween = ["us", "us"]\n')


def test_missing_pair_without_default(tmp_path):
    msg = err(tmp_path, """
    source = "illustrative"
    regions = ["us", "eu"]
    [[links]]
    from = "us"
    to = "eu"
    bandwidth_mbps = 10
    latency_ms = 5
    """)
    assert "no link for eu -> us" in msg and "[default]" in msg


def test_source_is_required(tmp_path):
    assert "`source` is required" in err(tmp_path, TWO.replace('source = "illustrative"', ""))


def test_unknown_keys_and_duplicate_regions(tmp_path):
    assert "unknown key(s) regoins" in err(tmp_path, TWO.replace("regions =", "regoins ="))
    assert "listed more than once" in err(tmp_path, TWO.replace('["us", "eu"]', '["us", "eu", "us"]'))
    assert "unknown key(s) bandwidth" in err(tmp_path, TWO.replace("bandwidth_mbps = 100", "bandwidth = 100"))


def test_bad_placement_mode(tmp_path):
    assert "must be \"cyclic\" or a list" in err(tmp_path, TWO.replace('"cyclic"', '"random"'))


def test_not_toml(tmp_path):
    assert "not valid TOML" in err(tmp_path, "regions = [\n")


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(TopologyError, match="does not exist"):
        load_topology(str(tmp_path / "nope.toml"))
    with pytest.raises(TopologyError) as e:
        load_topology("atlantis")
    assert "no topology named 'atlantis'" in str(e.value) and "five-continents" in str(e.value)


def test_topology_error_is_a_value_error():
    assert issubclass(TopologyError, ValueError)
    with pytest.raises(ValueError):
        default_topology().placement(0)
