#!/usr/bin/env python3
"""A client of oncewal's client service in Python, over the published .proto.

Generate the stubs from the repository root, then run this against a leader:

    python3 -m grpc_tools.protoc -I proto --python_out=/tmp/oncewal-py \
        --grpc_python_out=/tmp/oncewal-py proto/oncewal/client/v1/client.proto
    PYTHONPATH=/tmp/oncewal-py python3 examples/python/oncewal_client.py \
        --addr localhost:7070 --ca certs/ca.pem \
        --cert certs/client-load.pem --key certs/client-load-key.pem

It opens a session, runs a request (OK), retries it with the same request
ID (REPLAY: the recorded outcome, nothing runs twice), sends the same ID
with another payload (CONFLICT), and asks the request's status. Every line
it prints is "step: CODE ..."; it exits 1 if a step answers what it should
not.
"""

import argparse
import sys
import uuid

import grpc

from oncewal.client.v1 import client_pb2 as pb
from oncewal.client.v1 import client_pb2_grpc as pb_grpc


def ops(*items):
    """The default payload: put/add/delete ops, serialized deterministically
    so that a retry's payload is byte for byte the first attempt's."""
    return pb.Ops(ops=list(items)).SerializeToString(deterministic=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--request-id", default="py-" + uuid.uuid4().hex)
    args = ap.parse_args()

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    creds = grpc.ssl_channel_credentials(
        root_certificates=read(args.ca),
        private_key=read(args.key),
        certificate_chain=read(args.cert),
    )
    failed = False

    def expect(step, got, want, detail=""):
        nonlocal failed
        name = pb.Code.Name(got)
        print(f"{step}: {name} {detail}".rstrip(), flush=True)
        if got != want:
            print(f"{step}: want {pb.Code.Name(want)}", file=sys.stderr)
            failed = True

    with grpc.secure_channel(args.addr, creds) as ch:
        stub = pb_grpc.ClientStub(ch)
        opened = stub.OpenSession(pb.OpenSessionRequest(), timeout=30)
        expect("open_session", opened.code, pb.OK, f"horizon={opened.horizon}")

        payload = ops(pb.Op(kind=pb.Op.ADD, key=b"acct/alice", delta=10))
        req = pb.SubmitRequest(session=opened.session, request_id=args.request_id,
                               action="deposit 10", ack=pb.ACK_LEADER, payload=payload)
        first = stub.Submit(req, timeout=30)
        expect("submit", first.code, pb.OK, f"lsn={first.lsn} epoch={first.epoch}")

        retry = stub.Submit(req, timeout=30)
        expect("retry", retry.code, pb.REPLAY, f"lsn={retry.lsn}")

        other = pb.SubmitRequest(session=opened.session, request_id=args.request_id,
                                 action="deposit 11", ack=pb.ACK_LEADER,
                                 payload=ops(pb.Op(kind=pb.Op.ADD, key=b"acct/alice", delta=11)))
        conflict = stub.Submit(other, timeout=30)
        expect("conflict", conflict.code, pb.CONFLICT)

        status = stub.Status(pb.StatusRequest(session=opened.session, request_id=args.request_id), timeout=30)
        expect("status", status.code, pb.REPLAY)

        try:
            stub.Submit(pb.SubmitRequest(session=b"short", request_id="x"), timeout=30)
            print("malformed: answered", file=sys.stderr)
            failed = True
        except grpc.RpcError as e:
            print(f"malformed: {e.code().name}", flush=True)
            if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
