"""The local nodes' loopback addresses, and the /etc/hosts names that keep torch's connections off DNS.

A local run gives each node's pods their own loopback address, `127.0.0.{2 + index}` (pod index 0 on
127.0.0.2), and the system pods 127.0.0.1: a pod's `status.podIP` and its headless DNS name both map
there (localrun/executor.py).

torch names both ends of every TCPStore connection it opens or accepts (c10d's `formatSockAddr`: a
reverse lookup, `getnameinfo`). Its sockets are IPv6 with IPv4 mapped in, so the peer is
`::ffff:127.0.0.2`, which an IPv4 line of /etc/hosts does not name: glibc asks the DNS server for
`2.0.0.127.in-addr.arpa`. A server that drops the query costs that connection glibc's 5 s resolver
timeout, in the connecting rank or in the store's accepting thread, where every client of the store
waits behind it: the in-process monitors' heartbeats stopped for 5 s and NVRx counted ranks
unresponsive that were training. On EKS the pods' addresses are named by the cluster's DNS (CoreDNS
answers `in-addr.arpa` for pod IPs), so only local runs need this.

`missing(hosts_text, addresses)` lists the addresses /etc/hosts does not name in either form;
`python localrun/addresses.py --add N` (root) appends names for 127.0.0.1 and N node addresses, as
.ci/run does. Stdlib only, so that it runs before the virtualenv exists.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path

SYSTEM_ADDRESS = "127.0.0.1"
"""The local run's system pods (the rendezvous store) and the address ranks connect from."""
HOSTS = Path("/etc/hosts")
NAME_PREFIX = "nvrx-local"
DEFAULT_NODES = 64
"""How many node addresses `--add` names by default: more than any local run here starts."""


def node_address(index: int) -> str:
    """The loopback address of the local node that runs pod `index`."""
    return f"127.0.0.{2 + index}"


def run_addresses(nodes: int) -> list[str]:
    """The addresses a local run of `nodes` pod indexes uses: the system pods' and each node's."""
    return [SYSTEM_ADDRESS, *(node_address(index) for index in range(nodes))]


def _named(hosts_text: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    named = set()
    for line in hosts_text.splitlines():
        address, *names = line.split("#", 1)[0].split() or [""]
        if names:
            try:
                named.add(ipaddress.ip_address(address))
            except ValueError:
                continue
    return named


def _forms(address: str) -> tuple[str, str]:
    return address, f"::ffff:{address}"


def missing(hosts_text: str, addresses: list[str]) -> list[str]:
    """The IPv4 `addresses` that `hosts_text` (an /etc/hosts) does not name both as themselves and in
    their IPv4-mapped IPv6 form, the one torch's sockets look up."""
    named = _named(hosts_text)
    return [a for a in addresses if any(ipaddress.ip_address(form) not in named for form in _forms(a))]


def missing_lines(hosts_text: str, addresses: list[str]) -> list[str]:
    """The /etc/hosts lines that name the forms of `addresses` that `hosts_text` does not name."""
    named = _named(hosts_text)
    lines = []
    for address in addresses:
        last = int(address.rsplit(".", 1)[1])
        name = f"{NAME_PREFIX}-system" if address == SYSTEM_ADDRESS else f"{NAME_PREFIX}-node-{last - 2}"
        lines += [f"{form} {name}" for form in _forms(address) if ipaddress.ip_address(form) not in named]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument(
        "--add",
        type=int,
        nargs="?",
        const=DEFAULT_NODES,
        metavar="NODES",
        help="append the names /etc/hosts lacks for 127.0.0.1 and NODES node addresses "
        f"(default {DEFAULT_NODES}); without it, print them",
    )
    parser.add_argument("--hosts", type=Path, default=HOSTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    nodes = DEFAULT_NODES if args.add is None else args.add
    text = args.hosts.read_text(encoding="utf-8") if args.hosts.exists() else ""
    lines = missing_lines(text, run_addresses(nodes))
    if args.add is None:
        print("\n".join(lines) if lines else f"{args.hosts} names every local node address")
        return 0
    if lines:
        separator = "\n" if text and not text.endswith("\n") else ""
        with args.hosts.open("a", encoding="utf-8") as hosts:
            hosts.write(separator + "\n".join(lines) + "\n")
    print(f"{args.hosts}: {len(lines)} names of local node addresses added")
    return 0


if __name__ == "__main__":
    sys.exit(main())
