"""The 3-node shape of zk-compose.yml, without Docker: three servers from the jars on loopback; and the chaos
ensemble's links (a proxy between every two servers), which cut one server off from its peers."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError
from kazoo.retry import KazooRetry

from broker_sim.chaos.ensemble import ChaosEnsemble
from broker_sim.sim.netproxy import NetProxy
from controller.zk.server import ensemble, four_letter_word, start_ensemble
from tests.waiting import wait_until


@pytest.mark.slow
def test_three_node_ensemble_survives_one_server_down(tmp_path):
    servers = ensemble(tmp_path, 3)
    try:
        start_ensemble(servers)
        modes = sorted(four_letter_word(s.host, s.port, "srvr").split("Mode:")[1].split()[0] for s in servers)
        assert modes == ["follower", "follower", "leader"]
        hosts = ",".join(s.address for s in servers)
        client = KazooClient(hosts=hosts, timeout=6.0)
        client.start(timeout=30)
        try:
            client.create("/ens/a", b"1", makepath=True)
            # stop the server this client is connected to, if possible, else the leader
            leader = next(s for s in servers if "Mode: leader" in four_letter_word(s.host, s.port, "srvr"))
            leader.stop()
            # kazoo reconnects to a surviving server; a request caught in the re-election gets ConnectionLoss
            # and is retried, as every ZooKeeper client must (a create retried after it landed finds the node)
            retry = KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0, deadline=60.0)
            retry(client.set, "/ens/a", b"2")

            def create_b() -> None:
                try:
                    client.create("/ens/b", b"3")
                except NodeExistsError:
                    pass

            retry(create_b)
            assert client.get("/ens/a")[0] == b"2"
            assert sorted(client.get_children("/ens")) == ["a", "b"]
            survivors = [s for s in servers if s is not leader]
            assert all(s.is_serving() for s in survivors)
        finally:
            client.stop()
            client.close()
    finally:
        for s in servers:
            s.stop()
    assert not any(s.is_running() for s in servers)


@pytest.mark.slow
def test_a_server_cut_off_from_its_peers_stops_serving_and_its_clients_move_through_one_proxy(tmp_path):
    """The chaos ensemble's links, for real: a follower cut off from both peers (its client port still open)
    loses its quorum and stops serving; a client that reached the ensemble through one proxy in front of all
    three servers keeps its session on the others; rejoined, the server serves again."""
    ens = ChaosEnsemble(tmp_path)
    proxy = NetProxy.for_hosts(ens.hosts, name="proxy-client")
    client = None
    try:
        ens.start()
        assert sorted(str(m) for m in ens.modes().values()) == ["follower", "follower", "leader"]
        client = KazooClient(hosts=proxy.address, timeout=6.0)
        client.start(timeout=30)
        session = client.client_id
        client.create("/cut/a", b"1", makepath=True)
        sid = ens.pick("follower")
        ens.isolate(sid)
        wait_until(lambda: ens.mode(sid) is None, 60, "the cut-off server to stop serving")
        assert four_letter_word("127.0.0.1", ens.servers[sid].port, "ruok") == "imok"  # its clients still reach it
        retry = KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0, deadline=60.0)
        retry(client.set, "/cut/a", b"2")
        assert client.client_id == session and client.get("/cut/a")[0] == b"2"
        ens.rejoin(sid)
        wait_until(lambda: ens.mode(sid) == "follower", 60, "the server to serve again")
    finally:
        if client is not None:
            client.stop()
            client.close()
        ens.close()
        proxy.close()
    assert not any(s.is_running() for s in ens.servers.values())
