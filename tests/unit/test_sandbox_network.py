"""What a sandbox's own network refuses, and how pasta is started: checked without a network."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from mcpvisor.runtime import network


def covered(address: str, prefixes: list[network.Network]) -> bool:
    ip = ipaddress.ip_address(address)
    return any(ip.version == prefix.version and ip in prefix for prefix in prefixes)


def test_link_local_the_hosts_addresses_and_private_ranges_are_refused() -> None:
    refused = network.blocked(private=False, host=["192.0.2.2", "198.18.0.1", "fd00::2", "127.0.0.1"])
    for address in ("169.254.169.254", "10.1.2.3", "172.20.0.1", "192.168.1.1", "100.64.0.1", "fd00:ec2::254",
                    "fe80::1", "198.18.0.1", "192.0.2.2", "0.0.0.0", "224.0.0.1"):  # fmt: skip
        assert covered(address, refused), address
    # Out on the internet, and the DNS forwarder pasta answers on, stay open.
    for address in ("198.18.0.2", "1.1.1.1", "2001:db8::1", network.DNS_FORWARD):
        assert not covered(address, refused), address
    # The namespace's loopback is its own: nothing to refuse there.
    assert not covered("127.0.0.1", refused)


def test_private_ranges_can_be_allowed_but_never_link_local_or_the_host() -> None:
    allowed = network.blocked(private=True, host=["192.0.2.2"])
    assert not covered("10.1.2.3", allowed) and not covered("fd00::5", allowed)
    assert covered("169.254.169.254", allowed) and covered("192.0.2.2", allowed) and covered("fe80::1", allowed)


def test_pasta_forwards_nothing_to_the_host_and_maps_no_gateway() -> None:
    argv = network.pasta_argv("/usr/bin/pasta", 5, 6)
    for pair in (("--tcp-ports", "none"), ("--udp-ports", "none"), ("--tcp-ns", "none"), ("--udp-ns", "none")):
        assert argv[argv.index(pair[0]) + 1] == pair[1]
    assert "--no-map-gw" in argv and "--config-net" in argv and "--foreground" in argv
    assert argv[argv.index("--netns") + 1] == "/proc/self/fd/5"
    assert argv[argv.index("--userns") + 1] == "/proc/self/fd/6"


def test_resolv_conf_names_the_forwarder_and_keeps_the_search_domains(tmp_path: Path) -> None:
    host = tmp_path / "resolv.conf"
    host.write_text("nameserver 127.0.0.53\nsearch corp.example\noptions edns0\n")
    assert network.resolv_conf(str(host)).decode().splitlines() == [
        f"nameserver {network.DNS_FORWARD}",
        "search corp.example",
        "options edns0",
    ]


def test_a_missing_pasta_or_tun_device_is_named_with_its_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(network, "pasta", lambda: None)
    assert "install passt" in (network.problem(privileged=False) or "")
    monkeypatch.setattr(network, "pasta", lambda: "/usr/bin/pasta")
    monkeypatch.setattr(network, "TUN", str(tmp_path / "tun"))
    assert "--device /dev/net/tun" in (network.problem(privileged=False) or "")
    (tmp_path / "tun").write_text("")
    (tmp_path / "tun").chmod(0o600)
    assert "make it 0666" in (network.problem(privileged=True) or "")
    (tmp_path / "tun").chmod(0o666)
    assert network.problem(privileged=True) is None
