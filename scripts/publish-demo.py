#!/usr/bin/python3
"""Publishes KV-cache events into a running kvrouterd the way one vLLM engine would, for
trying kvrouterd without a GPU (README, Quick start):

    /usr/bin/python3 scripts/publish-demo.py            # into `make run` (tcp://127.0.0.1:5557)
    /usr/bin/python3 scripts/publish-demo.py --endpoint tcp://10.0.0.2:5557 --pod pod-b \\
        --model Qwen/Qwen3-8B --tokens 128

It runs the prompt token ids 0..TOKENS-1 through an emulated engine prefix cache
(tests/integration/vllm_pub.py, the emulator the integration tests use: ZeroMQ PUB connected
to kvrouterd's bound SUB, topic kv@POD@MODEL, msgpack batches of BlockStored events) and
prints the score query that now finds them. Needs python3-zmq and python3-msgpack (`make run`
installs them).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))

try:
    import zmq
    from vllm_pub import Engine
except ImportError as e:
    sys.exit("publish-demo: %s (install python3-zmq and python3-msgpack: `make run` does; "
             "run with Debian's /usr/bin/python3)" % e)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5557",
                    help="kvrouterd's [events] bind address (default %(default)s)")
    ap.add_argument("--pod", default="demo-pod", help="pod name (default %(default)s)")
    ap.add_argument("--model", default="demo/model", help="model name (default %(default)s)")
    ap.add_argument("--tokens", type=int, default=64,
                    help="prompt length: token ids 0..N-1 (default %(default)s)")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    ap.add_argument("--timeout", type=float, default=10.0,
                    help="seconds to wait for kvrouterd to subscribe (default %(default)s)")
    a = ap.parse_args()
    if a.tokens < 0 or a.block_size < 1:
        ap.error("--tokens must be >= 0 and --block-size >= 1")

    eng = Engine(pod=a.pod, model=a.model, mode="connect", endpoints=[a.endpoint],
                 block_size=a.block_size)
    try:
        try:
            eng.wait_subscriber(timeout=a.timeout)
        except Exception:
            sys.exit("publish-demo: kvrouterd did not subscribe on %s within %.0f s "
                     "(is it running? `make run`)" % (a.endpoint, a.timeout))
        rank = eng.rank(0)
        _, stored, _ = rank.request(list(range(a.tokens)))
        seq = rank.publish()
        # linger: the batch leaves before the socket closes
        rank.pub.setsockopt(zmq.LINGER, 5000)
    finally:
        eng.close()
    print("published seq %d: %d block(s) of %d tokens stored by pod %s, model %s, on %s"
          % (seq, len(stored), a.block_size, a.pod, a.model, a.endpoint))
    print("score it:\n  curl -s localhost:8080/v1/score -H 'Content-Type: application/json' "
          "-d '{\"model\": \"%s\", \"token_ids\": ['$(seq -s, 0 %d)']}'" % (a.model, a.tokens - 1))


if __name__ == "__main__":
    main()
