# A DNS responder for the sandbox VM test (tests/nixos/sandbox.nix), on UDP port 53 of every
# address of the VM, IPv4 and IPv6 (one dual-stack socket). It is the VM's resolver
# (networking.nameservers), so a container with a network resolves through it: @name@ has an A
# record (@ipv4@) and an AAAA record (@ipv6@); any other name is NXDOMAIN. That it answers at all is
# what the positive control shows; the sandbox must get no answer of any kind.
#
# Each reply leaves from the address its query was sent to. A wildcard socket's plain sendto()
# would take the source address of the route back instead: for a container on a podman network
# that is the network's gateway, not the VM's address the container asked, and a resolver that
# connect()s its UDP socket (glibc's, resolv/res_send.c) drops such a reply. So the socket is
# told each query's destination (IPV6_RECVPKTINFO; an IPv4 query on this dual-stack socket has
# it as an IPv4-mapped address) and the reply is sent from it (IPV6_PKTINFO).
import socket
import struct

NAME = "@name@"
RECORDS = {
    1: socket.inet_pton(socket.AF_INET, "@ipv4@"),  # A
    28: socket.inet_pton(socket.AF_INET6, "@ipv6@"),  # AAAA
}


def answer(query: bytes):
    if len(query) < 12:
        return None
    labels, i = [], 12
    while i < len(query) and query[i] != 0:
        n = query[i]
        labels.append(query[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    end = i + 5  # the root label, QTYPE, QCLASS
    if end > len(query):
        return None
    qtype = struct.unpack(">H", query[i + 1 : i + 3])[0]
    known = ".".join(labels).lower() == NAME
    rdata = RECORDS.get(qtype) if known else None
    # QR, RD, RA; RCODE 0 (NOERROR) for the known name, 3 (NXDOMAIN) for any other.
    flags = 0x8180 if known else 0x8183
    records = b""
    if rdata is not None:
        records = b"\xc0\x0c" + struct.pack(">HHIH", qtype, 1, 60, len(rdata)) + rdata
    header = query[:2] + struct.pack(">HHHHH", flags, 1, 1 if records else 0, 0, 0)
    return header + query[12:end] + records


def destination(ancillary):
    # struct in6_pktinfo: the 16-byte destination address, then the interface index.
    for level, kind, data in ancillary:
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_PKTINFO and len(data) >= 16:
            return data[:16]
    return None


sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
sock.bind(("::", 53))
print(f"answering {NAME} on [::]:53 and 0.0.0.0:53, from the address each query reached", flush=True)
while True:
    query, ancillary, _, peer = sock.recvmsg(512, socket.CMSG_SPACE(20))
    reply = answer(query)
    if reply is None:
        continue
    dst = destination(ancillary)
    # Interface 0: the route back picks it; the source address is the one given.
    pktinfo = [] if dst is None else [(socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, dst + struct.pack("@I", 0))]
    try:
        sock.sendmsg([reply], pktinfo, 0, peer)
    except OSError as e:
        print(f"reply to {peer[0]} failed: {e}", flush=True)
