# A DNS responder for the sandbox VM test (tests/nixos/sandbox.nix), on UDP port 53 of every
# address of the VM, IPv4 and IPv6 (one dual-stack socket). It is the VM's resolver
# (networking.nameservers), so a container with a network resolves through it: @name@ has an A
# record (@ipv4@) and an AAAA record (@ipv6@); any other name is NXDOMAIN. That it answers at all is
# what the positive control shows; the sandbox must get no answer of any kind.
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


sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
sock.bind(("::", 53))
print(f"answering {NAME} on [::]:53 and 0.0.0.0:53", flush=True)
while True:
    query, peer = sock.recvfrom(512)
    reply = answer(query)
    if reply is not None:
        sock.sendto(reply, peer)
