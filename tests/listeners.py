"""Which TCP sockets a set of processes listens on, read from /proc (Linux): what a test checks to know that
a group of processes exposes nothing beyond this machine."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp{,6}'s local address: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_addr)
    return ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))


def tcp_listeners(pids: list[int]) -> list[tuple[int, str]]:
    """(pid, address) of every listening TCP socket these processes hold (their fds' socket inodes)."""
    owner = {}
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except FileNotFoundError:  # it exited meanwhile: it listens on nothing
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except FileNotFoundError:  # closed meanwhile (the listing's own fd, for one)
                continue
            if target.startswith("socket:["):
                owner[target[len("socket:[") : -1]] = pid
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in owner:  # 0A: LISTEN
                addr, port = local.split(":")
                found.append((owner[inode], f"{_address(addr)}:{int(port, 16)}"))
    return found


def is_loopback(address: str) -> bool:
    """Whether "ip:port" is a loopback address (127.0.0.0/8, ::1, or IPv4-mapped 127.x)."""
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)
