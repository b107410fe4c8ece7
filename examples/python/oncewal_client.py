#!/usr/bin/env python3
"""A client of oncewal's client service in Python, over the published .proto.

Generate the stubs from the repository root, then run this against a leader
(the README's recipe: certificates from `oncewal gencerts ./certs --clients
load`, a leader on localhost:7070):

    python3 -m grpc_tools.protoc -I proto --python_out=/tmp/oncewal-py \\
        --grpc_python_out=/tmp/oncewal-py proto/oncewal/client/v1/client.proto
    PYTHONPATH=/tmp/oncewal-py python3 examples/python/oncewal_client.py \\
        --addr localhost:7070 --ca certs/ca.pem \\
        --cert certs/client-load.pem --key certs/client-load-key.pem

It routes each transaction to its keys' shard (the rule of package kvroute:
hash tag, SHA-256, jump hash; --check-routing checks it against
kvroute/testdata/shards.txt), keeps one session per shard, and then: opens
an account (OK), retries that request with the same ID (REPLAY: the
recorded result, nothing runs twice), moves money only if the balance
covers it (a conditional transaction, both branches), reads the balance back
(a linearizable Get) and the account's keys (Range), sees an add to a key
that is no counter rejected and the rejection recorded (REJECTED, again on
retry), and reuses a request ID for another request (CONFLICT). Every line
it prints is "step: CODE ..."; it exits 1 if a step answers what it should
not.
"""

import argparse
import hashlib
import struct
import sys
import uuid

import grpc

from oncewal.client.v1 import client_pb2 as pb
from oncewal.client.v1 import client_pb2_grpc as pb_grpc

MASK64 = (1 << 64) - 1


def hash_tag(key: bytes) -> bytes:
    """Redis Cluster's hash tag: the bytes between the first '{' and the
    first '}' after it, if any lie between; else the whole key."""
    start = key.find(b"{")
    if start < 0:
        return key
    end = key.find(b"}", start + 1)
    if end <= start + 1:
        return key
    return key[start + 1:end]


def jump_hash(k: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash (kvroute.JumpHash)."""
    b, j = -1, 0
    while j < buckets:
        b = j
        k = (k * 2862933555777941757 + 1) & MASK64
        j = int((b + 1) * (float(1 << 31) / float((k >> 33) + 1)))
    return max(b, 0)


def shard_of(key: bytes, shards: int) -> int:
    """The shard of key among shards (kvroute.Shard)."""
    if shards <= 1:
        return 0
    k = struct.unpack("<Q", hashlib.sha256(hash_tag(key)).digest()[:8])[0]
    return jump_hash(k, shards)


def check_routing(path):
    """Checks shard_of against the golden file every client must agree with."""
    rows = 0
    with open(path, encoding="ascii") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            key, shards, want = line.rstrip("\n").split("\t")
            got = shard_of(key.encode(), int(shards))
            if got != int(want):
                raise SystemExit(f"routing: {key!r} among {shards}: {got}, want {want}")
            rows += 1
    return rows


def counter(raw: bytes) -> int:
    """A counter's value: 8 bytes, little-endian, signed."""
    return struct.unpack("<q", raw)[0]


class Client:
    """One session per shard the caller's keys use, opened on first use."""

    def __init__(self, stub):
        self.stub = stub
        self.sessions = {}
        first = stub.OpenSession(pb.OpenSessionRequest(shard=0), timeout=30)
        if first.code != pb.OK:
            raise SystemExit(f"open_session: {pb.Code.Name(first.code)}: {first.message}")
        self.shards = first.shards
        self.sessions[first.shard] = first.session

    def session(self, key: bytes) -> bytes:
        shard = shard_of(key, self.shards)
        if shard not in self.sessions:
            rep = self.stub.OpenSession(pb.OpenSessionRequest(shard=shard), timeout=30)
            if rep.code != pb.OK or rep.shard != shard:
                raise SystemExit(f"open_session in shard {shard}: {pb.Code.Name(rep.code)}: {rep.message}")
            self.sessions[shard] = rep.session
        return self.sessions[shard]

    def txn(self, request_id, key, compares=(), success=(), failure=()):
        req = pb.TxnRequest(session=self.session(key), request_id=request_id, ack=pb.ACK_LEADER,
                            compares=list(compares), success=list(success), failure=list(failure))
        return self.stub.Txn(req, timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--run", default=uuid.uuid4().hex[:8], help="a prefix that makes this run's request IDs and keys its own")
    ap.add_argument("--check-routing", metavar="SHARDS_TXT", help="check the routing against kvroute/testdata/shards.txt first")
    args = ap.parse_args()
    if args.check_routing:
        print(f"routing: {check_routing(args.check_routing)} rows agree", flush=True)

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    creds = grpc.ssl_channel_credentials(root_certificates=read(args.ca), private_key=read(args.key),
                                         certificate_chain=read(args.cert))
    failed = False

    def expect(step, got, want, detail=""):
        nonlocal failed
        print(f"{step}: {pb.Code.Name(got)} {detail}".rstrip(), flush=True)
        if got != want:
            print(f"{step}: want {pb.Code.Name(want)}", file=sys.stderr)
            failed = True

    def check(step, ok, detail):
        nonlocal failed
        if not ok:
            print(f"{step}: {detail}", file=sys.stderr)
            failed = True

    run = args.run
    balance = f"{{acct:{run}}}/balance".encode()
    name = f"{{acct:{run}}}/name".encode()
    with grpc.secure_channel(args.addr, creds) as ch:
        c = Client(pb_grpc.ClientStub(ch))
        print(f"shards: {c.shards}; the account's shard: {shard_of(balance, c.shards)}", flush=True)

        deposit = [pb.TxnOp(kind=pb.TxnOp.ADD, key=balance, delta=100),
                   pb.TxnOp(kind=pb.TxnOp.PUT, key=name, value=b"Alice")]
        first = c.txn(f"{run}-open", balance, success=deposit)
        expect("open", first.code, pb.OK, f"lsn={first.lsn}")
        retry = c.txn(f"{run}-open", balance, success=deposit)
        expect("retry", retry.code, pb.REPLAY, f"lsn={retry.lsn}")
        check("retry", retry.result == first.result, "a replay answers the recorded result")

        def transfer(request_id, amount):
            return c.txn(request_id, balance,
                         compares=[pb.Compare(key=balance, target=pb.Compare.COUNTER, result=pb.Compare.GREATER,
                                              counter=amount - 1)],
                         success=[pb.TxnOp(kind=pb.TxnOp.ADD, key=balance, delta=-amount)],
                         failure=[pb.TxnOp(kind=pb.TxnOp.GET, key=balance)])

        paid = transfer(f"{run}-pay-30", 30)
        expect("transfer 30", paid.code, pb.OK, f"succeeded={paid.result.succeeded}")
        check("transfer 30", paid.result.succeeded, "100 covers 30")
        declined = transfer(f"{run}-pay-200", 200)
        expect("transfer 200", declined.code, pb.OK, f"succeeded={declined.result.succeeded}")
        check("transfer 200", not declined.result.succeeded and counter(declined.result.results[0].value) == 70,
              "70 does not cover 200: the else branch reads 70")

        got = c.stub.Get(pb.GetRequest(key=balance), timeout=30)
        expect("get", got.code, pb.OK, f"balance={counter(got.kv.value) if got.found else None} version={got.kv.version}")
        check("get", got.found and counter(got.kv.value) == 70, "the balance read back is 70")
        rng = c.stub.Range(pb.RangeRequest(prefix=f"{{acct:{run}}}/".encode()), timeout=30)
        expect("range", rng.code, pb.OK, f"keys={len(rng.kvs)}")
        check("range", [kv.key for kv in rng.kvs] == [balance, name], "the account's two keys, in order")

        for step in ("reject", "reject again"):
            rej = c.txn(f"{run}-bad-add", name, success=[pb.TxnOp(kind=pb.TxnOp.ADD, key=name, delta=1)])
            expect(step, rej.code, pb.REJECTED, f"{rej.rejection.code}")
            check(step, rej.rejection.code == "not_counter", "an add to a name is rejected: not_counter")

        conflict = c.txn(f"{run}-open", balance, success=[pb.TxnOp(kind=pb.TxnOp.ADD, key=balance, delta=1)])
        expect("conflict", conflict.code, pb.CONFLICT)

        try:
            c.stub.Txn(pb.TxnRequest(session=b"short", request_id="x"), timeout=30)
            print("malformed: answered", file=sys.stderr)
            failed = True
        except grpc.RpcError as e:
            print(f"malformed: {e.code().name}", flush=True)
            if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
