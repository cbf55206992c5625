"""Why ZooKeeper cannot be reached, in words an operator can act on: refused (nothing listens there), unknown
host (the name does not resolve) or no answer (a firewall, a dead machine, a server that hangs).

Asked only after a connection failed: kazoo retries every failure the same way, and ends with the same
time-out for all three."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass

HINT = "start one here with `zkctl zk start`, or point --zk (env ZKC_ZK) at yours"
#: of the connect timeout, the share kept to find out why a connection failed
PROBE_SHARE = 0.2
MAX_PROBE_S = 1.0
#: a command (not a long-running process) without a session after this long asks why at once: refused and
#: unknown host end it there (ZooKeeper on loopback sets a session up in milliseconds)
EARLY_PROBE_S = 0.5


@dataclass(frozen=True)
class Probe:
    """What one ``host:port`` did when we knocked: ``refused``, ``unknown host``, ``no answer``, ``open``
    (it accepts connections: something there answers, but no ZooKeeper session came of it) or ``bad address``."""

    address: str
    outcome: str


def split_hosts(hosts: str) -> list[tuple[str, int | None]]:
    """``host[:port],...`` (a chroot suffix ignored) as pairs; None for a port that is not a number."""
    out: list[tuple[str, int | None]] = []
    for item in hosts.split("/", 1)[0].split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):  # [ipv6]:port
            host, _, rest = item[1:].partition("]")
            port_text = rest.lstrip(":") or "2181"
        else:
            host, sep, port_text = item.rpartition(":")
            if not sep:
                host, port_text = item, "2181"
        out.append((host, int(port_text) if port_text.isdigit() and 0 < int(port_text) < 65536 else None))
    return out


def probe(host: str, port: int | None, timeout: float) -> Probe:
    """One TCP connection attempt to ``host:port``, bounded by ``timeout`` (name resolution included)."""
    address = f"{host}:{port}"
    if port is None or not host:
        return Probe(address, "bad address")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return Probe(address, "unknown host")
    except OSError:
        return Probe(address, "unknown host")
    outcome = "no answer"
    for family, kind, proto, _name, sockaddr in infos[:4]:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(sockaddr)
            except ConnectionRefusedError:
                outcome = "refused"
                continue
            except OSError:
                continue
            return Probe(address, "open")
    return Probe(address, outcome)


def diagnose(hosts: str, timeout: float) -> list[Probe]:
    """Probe every address of ``hosts``, all within ``timeout`` (a name server that hangs counts as no answer)."""
    pairs = split_hosts(hosts)
    results: list[Probe | None] = [None] * len(pairs)

    def run(i: int, host: str, port: int | None) -> None:
        results[i] = probe(host, port, timeout)

    threads = [
        threading.Thread(target=run, args=(i, h, p), name=f"zk-probe-{i}", daemon=True)
        for i, (h, p) in enumerate(pairs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 0.05)
    return [r or Probe(f"{h}:{p}", "no answer") for r, (h, p) in zip(results, pairs)]


def hopeless(probes: list[Probe]) -> bool:
    """Whether no address can answer: every one refused, unknown or malformed (a silent one may yet answer)."""
    return bool(probes) and all(p.outcome in ("refused", "unknown host", "bad address") for p in probes)


def explain(hosts: str, probes: list[Probe], waited: float) -> str:
    """The one-line error: what each address did, and the hint."""
    outcomes = {p.outcome for p in probes}
    if outcomes == {"refused"}:
        what = "connection refused (nothing listens there)"
    elif outcomes == {"unknown host"}:
        what = "unknown host"
    elif outcomes == {"no answer"}:
        what = f"no answer within {waited:g}s"
    elif outcomes == {"open"}:
        what = f"no answer within {waited:g}s (a connection opens, but no ZooKeeper session: not ZooKeeper, or not serving)"
    else:
        what = "; ".join(f"{p.address} {p.outcome}" for p in probes)
    return f"cannot connect to ZooKeeper at {hosts}: {what}; {HINT}"


__all__ = [
    "Probe",
    "split_hosts",
    "probe",
    "diagnose",
    "hopeless",
    "explain",
    "EARLY_PROBE_S",
    "HINT",
    "PROBE_SHARE",
    "MAX_PROBE_S",
]
