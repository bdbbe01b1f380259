"""Differential check of the KV server against redis-server: the same random commands and the
same random (often malformed) protocol streams go to both; every reply, and whether and when
the connection is closed, must be the same.

    KV_PORT=6390 REDIS_PORT=6379 python Examples/KV/tests/differential.py [seed] [commands] [streams]

Replies whose order or choice is random by design (SMEMBERS, HGETALL, SPOP) are compared as
sets, or the key is dropped on both sides after them. Exits 1 on the first differences.

Not part of `make test`: the streams wait 0.3 s on each server for a close that may not come
(a minute for 100 streams), and relative expiry compared with GT/LT (`PEXPIRE k 5000000 GT`
right after `PEXPIRE k 5000000`) depends on whether the two commands fell in the same
millisecond on each server, so a rare difference there is timing, not behaviour.
"""

import os
import random
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_commands  # noqa: E402
from test_commands import Raw  # noqa: E402

OURS = int(os.environ.get("KV_PORT", "6390"))
REDIS = int(os.environ.get("REDIS_PORT", "6379"))


def connect(port):
    test_commands.PORT = port
    return Raw()


KEYS = ["k1", "k2", "k3", "l1", "h1", "s1", ""]
VALUES = ["0", "1", "-1", "10", "abc", "", "9223372036854775807", "-9223372036854775808", "01", " 5", "3.5", "xxxxx"]
OPTIONS = ["NX", "XX", "GT", "LT", "EX", "PX", "EXAT", "PXAT", "KEEPTTL", "GET", "foo", "COUNT", "MATCH", "TYPE"]


def grammar(rnd):
    def v():
        return rnd.choice(VALUES)

    def k():
        return rnd.choice(KEYS)

    def some(n):
        return [v() for _ in range(rnd.randint(0, n))]

    return {
        "SET": lambda: [k(), v()] + rnd.sample(OPTIONS, rnd.randint(0, 2)) + ([v()] if rnd.random() < .3 else []),
        "GET": lambda: [k()], "GETSET": lambda: [k(), v()],
        "MSET": lambda: [k(), v()] * rnd.randint(0, 2) + ([k()] if rnd.random() < .2 else []),
        "MGET": lambda: [k() for _ in range(rnd.randint(0, 3))], "INCR": lambda: [k()], "DECR": lambda: [k()],
        "INCRBY": lambda: [k(), v()], "DECRBY": lambda: [k(), v()], "APPEND": lambda: [k(), v()],
        "STRLEN": lambda: [k()], "LPUSH": lambda: [k()] + some(3), "RPUSH": lambda: [k()] + some(3),
        "LPOP": lambda: [k()] + some(1), "RPOP": lambda: [k()] + some(1), "LLEN": lambda: [k()],
        "LRANGE": lambda: [k(), v(), v()], "LINDEX": lambda: [k(), v()], "HSET": lambda: [k()] + some(4),
        "HGET": lambda: [k(), v()], "HDEL": lambda: [k(), v(), v()], "HLEN": lambda: [k()],
        "HEXISTS": lambda: [k(), v()], "HINCRBY": lambda: [k(), v(), v()], "HGETALL": lambda: [k()],
        "SADD": lambda: [k()] + some(3), "SREM": lambda: [k(), v()], "SCARD": lambda: [k()],
        "SISMEMBER": lambda: [k(), v()], "SMEMBERS": lambda: [k()], "EXISTS": lambda: [k(), k()],
        "DEL": lambda: [k()], "UNLINK": lambda: [k(), k()], "TYPE": lambda: [k()],
        "EXPIRE": lambda: [k(), rnd.choice(["100", "200", "0", "-1", "abc"])]
        + rnd.sample(["NX", "XX", "GT", "LT", "foo"], rnd.randint(0, 2)),
        "PEXPIRE": lambda: [k(), rnd.choice(["100000", "5000000"])] + rnd.sample(["NX", "XX", "GT", "LT"], rnd.randint(0, 1)),
        "PERSIST": lambda: [k()], "DBSIZE": lambda: [], "PING": lambda: [v()] * rnd.randint(0, 2),
        "ECHO": lambda: [v()], "SELECT": lambda: [rnd.choice(["0", "16", "x"])],
        "SPOP": lambda: [k()] + rnd.choice([[], [v()], ["0"], ["-1"], ["abc"]]),
    }


def commands(seed, count):
    rnd = random.Random(seed)
    spec = grammar(rnd)
    names = sorted(spec)
    ours, redis = connect(OURS), connect(REDIS)
    ours.call("FLUSHALL")
    redis.call("FLUSHALL")
    diffs = 0
    for _ in range(count):
        name = rnd.choice(names)
        args = [rnd.choice([name, name.lower()])] + spec[name]()
        a, b = ours.call(*args), redis.call(*args)
        if name == "SPOP" and a[:1] == b[:1] and a not in (b"$-1\r\n", b"*0\r\n") and not a.startswith(b"-"):
            ours.call("DEL", args[1])  # a random pick: drop the key on both sides
            redis.call("DEL", args[1])
            continue
        if name in ("SMEMBERS", "HGETALL") and a[:1] == b"*" == b[:1]:
            a, b = sorted(a.split(b"\r\n")), sorted(b.split(b"\r\n"))
        if a != b:
            diffs += 1
            print("DIFF", args, a, b)
    return diffs


def run_stream(port, data, rnd):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(0.3)
    i = 0
    while i < len(data):
        j = i + rnd.randint(1, 40)
        try:
            sock.sendall(data[i:j])
        except (BrokenPipeError, ConnectionResetError):
            break
        i = j
    out = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                out += b"<closed>"
                break
            out += chunk
    except socket.timeout:
        pass
    except ConnectionResetError:
        out += b"<closed>"
    sock.close()
    return out


PIECES = [b"*1\r\n$4\r\nPING\r\n", b"PING\r\n", b"ECHO \"a\\x41\"\r\n", b"*2\r\n$4\r\nECHO\r\n$3\r\nabc\r\n",
          b"*", b"$", b"\r\n", b"\n", b"\r", b"1", b"-1", b"0", b"'", b"\"", b" ", b"x", b"\x00", b"*0\r\n", b"*-1\r\n",
          b"*2\r\n", b"$3\r\n", b"ECHO", b":", b"+", b"\\", b"*1\r\n$4\r\nECHO\r\n", b"ECHO 'x'y\r\n", b"$-5\r\n",
          b"*3x\r\n"]


def streams(seed, count):
    rnd = random.Random(seed)
    diffs = 0
    for _ in range(count):
        data = b"".join(rnd.choice(PIECES) for _ in range(rnd.randint(1, 12)))
        state = rnd.getstate()
        a = run_stream(OURS, data, rnd)
        rnd.setstate(state)
        b = run_stream(REDIS, data, rnd)
        if a != b:
            diffs += 1
            print("DIFF", data, a, b)
    return diffs


if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    n_commands = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    n_streams = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    d1 = commands(seed, n_commands)
    d2 = streams(seed, n_streams)
    print("%d commands, %d streams: %d differences" % (n_commands, n_streams, d1 + d2))
    sys.exit(1 if d1 + d2 else 0)
