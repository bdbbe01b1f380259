"""The oracle for the KV server: commands, replies, types and error replies as redis-server 7.0
gives them. The same file passes against `redis-server` and must pass against our server.

    KV_PORT=6379 python -m pytest Examples/KV/tests/test_commands.py

Needs redis-py (`pip install redis pytest`); the client is made with `protocol=2`, since
redis-py 8 asks for RESP3 by default. Every test starts from FLUSHALL. Differences that
are deliberate (RESP3, several databases, COMMAND DOCS' content, element order) are not tested.
"""

import os
import socket
import time

import pytest
import redis
from redis.exceptions import ResponseError

PORT = int(os.environ.get("KV_PORT", "6379"))
HOST = os.environ.get("KV_HOST", "127.0.0.1")


@pytest.fixture
def r():
    # RESP2 explicitly: redis-py 8 would otherwise send HELLO 3, and our server speaks RESP2 only.
    client = redis.Redis(host=HOST, port=PORT, socket_timeout=10, protocol=2)
    client.flushall()
    yield client
    client.close()


class Raw:
    """A RESP client over a plain socket: exact reply bytes, and protocol misuse."""

    def __init__(self):
        self.sock = socket.create_connection((HOST, PORT), timeout=10)
        self.buffer = b""

    def close(self):
        self.sock.close()

    def send(self, data):
        self.sock.sendall(data)

    @staticmethod
    def encode(*args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, str):
                a = a.encode()
            elif isinstance(a, int):
                a = str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def _fill(self):
        data = self.sock.recv(1 << 16)
        if not data:
            raise EOFError
        self.buffer += data

    def read_line(self):
        while b"\r\n" not in self.buffer:
            self._fill()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def read_exact(self, n):
        while len(self.buffer) < n:
            self._fill()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def read_reply_bytes(self):
        """One whole reply, as the bytes that came."""
        line = self.read_line()
        out = line + b"\r\n"
        kind = line[:1]
        if kind == b"$":
            n = int(line[1:])
            if n >= 0:
                out += self.read_exact(n + 2)
        elif kind == b"*":
            n = int(line[1:])
            for _ in range(max(n, 0)):
                out += self.read_reply_bytes()
        return out

    def call(self, *args):
        self.send(self.encode(*args))
        return self.read_reply_bytes()

    def closed_by_server(self, timeout=5):
        """True once the server has closed the connection (after what it still had to send)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    return True
                self.buffer += data
        except socket.timeout:
            return False


@pytest.fixture
def raw(r):
    client = Raw()
    yield client
    client.close()


def error_of(fn, *args):
    with pytest.raises(ResponseError) as info:
        fn(*args)
    return str(info.value)


WRONGTYPE = b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
NOT_INTEGER = b"-ERR value is not an integer or out of range\r\n"
SYNTAX = b"-ERR syntax error\r\n"


def arity(name):
    return b"-ERR wrong number of arguments for '%s' command\r\n" % name.encode()


# --- Connection ---------------------------------------------------------------------------


def test_ping_echo(r, raw):
    assert r.ping() is True
    assert raw.call("PING") == b"+PONG\r\n"
    assert raw.call("ping", "hello") == b"$5\r\nhello\r\n"
    assert raw.call("PING", "a", "b") == arity("ping")
    assert raw.call("ECHO", "x\x00y") == b"$3\r\nx\x00y\r\n"
    assert raw.call("ECHO") == arity("echo")
    assert r.echo(b"\xff\x00bin") == b"\xff\x00bin"


def test_quit_replies_ok_then_closes(raw):
    assert raw.call("QUIT") == b"+OK\r\n"
    assert raw.closed_by_server()


def test_select(raw):
    assert raw.call("SELECT", "0") == b"+OK\r\n"
    assert raw.call("SELECT", "16") == b"-ERR DB index is out of range\r\n"
    assert raw.call("SELECT", "-1") == b"-ERR DB index is out of range\r\n"
    assert raw.call("SELECT", "abc") == NOT_INTEGER
    assert raw.call("SELECT", "99999999999") == (
        b"-ERR value is out of range, value must between -2147483648 and 2147483647\r\n")
    assert raw.call("SELECT") == arity("select")


def test_unknown_command(raw):
    assert raw.call("foo", "a", "b") == (
        b"-ERR unknown command 'foo', with args beginning with: 'a' 'b' \r\n")
    assert raw.call("foo") == b"-ERR unknown command 'foo', with args beginning with: \r\n"
    assert raw.call("GETT", "k") == b"-ERR unknown command 'GETT', with args beginning with: 'k' \r\n"


def test_command_names_are_case_insensitive(r, raw):
    assert raw.call("sEt", "k", "v") == b"+OK\r\n"
    assert raw.call("GeT", "k") == b"$1\r\nv\r\n"


def test_hello(raw):
    assert raw.call("HELLO", "4") == b"-NOPROTO unsupported protocol version\r\n"
    assert raw.call("HELLO", "1") == b"-NOPROTO unsupported protocol version\r\n"
    assert raw.call("HELLO", "x") == b"-ERR Protocol version is not an integer or out of range\r\n"
    assert raw.call("HELLO", "2", "foo") == b"-ERR Syntax error in HELLO option 'foo'\r\n"
    raw.send(Raw.encode("HELLO", "2", "SETNAME", "oracle"))
    reply = raw.read_reply_bytes()
    assert reply.startswith(b"*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n")
    assert b"$5\r\nproto\r\n:2\r\n" in reply
    assert b"$4\r\nmode\r\n$10\r\nstandalone\r\n" in reply
    assert raw.call("CLIENT", "GETNAME") == b"$6\r\noracle\r\n"


def test_client(r, raw):
    assert raw.call("CLIENT", "GETNAME") == b"$-1\r\n"
    assert raw.call("CLIENT", "SETNAME", "worker-1") == b"+OK\r\n"
    assert raw.call("CLIENT", "GETNAME") == b"$8\r\nworker-1\r\n"
    assert raw.call("CLIENT", "SETNAME", "a b") == (
        b"-ERR Client names cannot contain spaces, newlines or special characters.\r\n")
    assert raw.call("CLIENT", "SETNAME") == arity("client|setname")
    ident = raw.call("CLIENT", "ID")
    assert ident.startswith(b":") and int(ident[1:-2]) > 0
    assert raw.call("CLIENT", "ID", "x") == arity("client|id")
    assert raw.call("CLIENT", "foo") == b"-ERR unknown subcommand 'foo'. Try CLIENT HELP.\r\n"
    listing = raw.call("CLIENT", "LIST")
    assert listing.startswith(b"$")
    assert b"name=worker-1" in listing and b"id=" in listing
    assert r.client_id() > 0


# --- Server -------------------------------------------------------------------------------


def test_dbsize_flushall_flushdb(r, raw):
    r.mset({"a": 1, "b": 2, "c": 3})
    assert r.dbsize() == 3
    assert raw.call("DBSIZE") == b":3\r\n"
    assert raw.call("DBSIZE", "x") == arity("dbsize")
    assert raw.call("FLUSHDB", "ASYNC") == b"+OK\r\n"
    assert r.dbsize() == 0
    r.set("a", 1)
    assert raw.call("FLUSHALL", "sync") == b"+OK\r\n"
    assert r.dbsize() == 0
    assert raw.call("FLUSHALL", "foo") == SYNTAX
    assert raw.call("FLUSHALL", "ASYNC", "SYNC") == SYNTAX
    assert raw.call("FLUSHDB", "bar") == SYNTAX
    r.set("a", 1)
    assert r.flushdb() is True and r.dbsize() == 0


def bulk_text(reply):
    header, _, rest = reply.partition(b"\r\n")
    assert header.startswith(b"$")
    return rest[:int(header[1:])].decode()


def test_info(r, raw):
    r.set("k", "v")
    r.set("t", "v", ex=100)
    r.get("k")
    r.get("missing")
    info = r.info()
    assert info["redis_version"].startswith("7.")
    assert info["redis_mode"] == "standalone"
    assert info["process_id"] > 0
    assert info["tcp_port"] == PORT
    assert info["uptime_in_seconds"] >= 0
    assert info["connected_clients"] >= 1
    assert info["used_memory"] > 0
    assert isinstance(info["used_memory_human"], str)
    assert info["total_commands_processed"] > 0
    assert info["instantaneous_ops_per_sec"] >= 0
    assert info["keyspace_hits"] >= 1
    assert info["keyspace_misses"] >= 1
    assert info["expired_keys"] >= 0
    assert info["db0"]["keys"] == 2 and info["db0"]["expires"] == 1
    assert "avg_ttl" in info["db0"]
    stats = r.info("stats")
    assert "total_commands_processed" in stats and "redis_version" not in stats
    both = bulk_text(raw.call("INFO", "server", "CLIENTS"))
    assert "# Server\r\n" in both and "# Clients\r\n" in both and "# Stats" not in both
    assert raw.call("INFO", "nosuchsection") == b"$0\r\n\r\n"
    keyspace = bulk_text(raw.call("INFO", "keyspace"))
    assert keyspace.startswith("# Keyspace\r\ndb0:keys=2,expires=1,avg_ttl=")


def test_info_counts_hits_misses_and_expired(r):
    before = r.info("stats")
    r.set("k", "v")
    r.get("k")
    r.get("nothing")
    r.set("gone", "v", px=1)
    time.sleep(0.01)
    assert r.get("gone") is None
    after = r.info("stats")
    assert after["keyspace_hits"] - before["keyspace_hits"] == 1
    assert after["keyspace_misses"] - before["keyspace_misses"] == 2
    assert after["expired_keys"] - before["expired_keys"] == 1


def test_config_get(r, raw):
    assert r.config_get("save") == {"save": ""}
    assert r.config_get("appendonly") == {"appendonly": "no"}
    assert raw.call("CONFIG", "GET", "maxclients") == b"*2\r\n$10\r\nmaxclients\r\n$5\r\n10000\r\n"
    assert raw.call("CONFIG", "GET", "proto-max-bulk-len") == (
        b"*2\r\n$18\r\nproto-max-bulk-len\r\n$9\r\n536870912\r\n")
    assert r.config_get("client-output-buffer-limit") == {
        "client-output-buffer-limit":
            "normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60"}
    assert r.config_get("MAXCLIENTS") == {"MAXCLIENTS": "10000"}  # an exact name comes back as asked
    assert "maxclients" in r.config_get("maxc*")
    assert raw.call("CONFIG", "GET", "no-such-parameter") == b"*0\r\n"
    assert raw.call("CONFIG", "GET") == arity("config|get")
    assert raw.call("CONFIG", "foo") == b"-ERR unknown subcommand 'foo'. Try CONFIG HELP.\r\n"
    assert raw.call("CONFIG") == arity("config")


def test_config_set(r, raw):
    try:
        assert raw.call("CONFIG", "SET", "maxclients", "500") == b"+OK\r\n"
        assert r.config_get("maxclients") == {"maxclients": "500"}
        assert raw.call("CONFIG", "SET", "proto-max-bulk-len", "2mb") == b"+OK\r\n"
        assert r.config_get("proto-max-bulk-len") == {"proto-max-bulk-len": "2097152"}
        assert raw.call("CONFIG", "SET", "client-output-buffer-limit", "normal 1mb 512kb 10") == b"+OK\r\n"
        assert r.config_get("client-output-buffer-limit")["client-output-buffer-limit"].startswith(
            "normal 1048576 524288 10 slave ")
        assert raw.call("CONFIG", "SET", "no-such-thing", "1") == (
            b"-ERR Unknown option or number of arguments for CONFIG SET - 'no-such-thing'\r\n")
        assert raw.call("CONFIG", "SET", "maxclients", "abc") == (
            b"-ERR CONFIG SET failed (possibly related to argument 'maxclients') - argument couldn't be"
            b" parsed into an integer\r\n")
        assert raw.call("CONFIG", "SET", "proto-max-bulk-len", "10") == (
            b"-ERR CONFIG SET failed (possibly related to argument 'proto-max-bulk-len') - argument must be"
            b" between 1048576 and 9223372036854775807 inclusive\r\n")
        assert raw.call("CONFIG", "SET", "maxclients", "100", "maxclients", "200") == (
            b"-ERR CONFIG SET failed (possibly related to argument 'maxclients') - duplicate parameter\r\n")
        assert raw.call("CONFIG", "SET", "client-output-buffer-limit", "normal 1 2") == (
            b"-ERR CONFIG SET failed (possibly related to argument 'client-output-buffer-limit') - Wrong"
            b" number of arguments in buffer limit configuration.\r\n")
        assert raw.call("CONFIG", "SET", "client-output-buffer-limit", "foo 1 2 3") == (
            b"-ERR CONFIG SET failed (possibly related to argument 'client-output-buffer-limit') - Invalid"
            b" client class specified in buffer limit configuration.\r\n")
        assert raw.call("CONFIG", "SET", "maxclients") == arity("config|set")
        assert r.config_get("maxclients") == {"maxclients": "500"}  # failed sets changed nothing
    finally:
        raw.call("CONFIG", "SET", "maxclients", "10000")
        raw.call("CONFIG", "SET", "proto-max-bulk-len", "536870912")
        raw.call("CONFIG", "SET", "client-output-buffer-limit", "normal 0 0 0")


def test_command(r, raw):
    count = raw.call("COMMAND", "COUNT")
    assert count.startswith(b":") and int(count[1:]) >= 50
    assert raw.call("COMMAND", "COUNT", "x") == arity("command|count")
    assert raw.call("COMMAND", "foo") == b"-ERR unknown subcommand 'foo'. Try COMMAND HELP.\r\n"
    assert raw.call("COMMAND", "DOCS").startswith(b"*")
    info = raw.call("COMMAND", "INFO", "get")
    assert info.startswith(b"*1\r\n*10\r\n$3\r\nget\r\n:2\r\n")
    assert raw.call("COMMAND", "INFO", "nosuchcommand") == b"*1\r\n$-1\r\n"
    everything = r.command()
    assert {"get", "set", "lpush", "hset", "sadd", "scan"} <= set(everything)
    assert everything["get"]["arity"] == 2 and everything["set"]["arity"] == -3


# --- Keys ---------------------------------------------------------------------------------


def test_exists_del_unlink_type(r, raw):
    r.set("s", "v")
    r.rpush("l", "a")
    r.hset("h", "f", "v")
    r.sadd("z", "m")
    assert r.exists("s", "s", "l", "nope") == 3
    assert [r.type(k) for k in ("s", "l", "h", "z", "nope")] == [b"string", b"list", b"hash", b"set", b"none"]
    assert raw.call("TYPE", "s") == b"+string\r\n"
    assert raw.call("TYPE", "nope") == b"+none\r\n"
    assert r.delete("s", "l", "nope") == 2
    assert r.unlink("h", "z", "h") == 2
    assert r.dbsize() == 0
    assert raw.call("EXISTS") == arity("exists")
    assert raw.call("DEL") == arity("del")
    assert raw.call("UNLINK") == arity("unlink")
    assert raw.call("TYPE") == arity("type")


def test_binary_safe_keys_and_values(r):
    key = b"k\x00\r\n\xff\x01 "
    value = bytes(range(256)) * 4
    assert r.set(key, value)
    assert r.get(key) == value
    assert r.exists(key) == 1
    assert r.keys(b"k\x00*") == [key]
    r.rpush(b"\x00list", b"\x00", b"\r\n")
    assert r.lrange(b"\x00list", 0, -1) == [b"\x00", b"\r\n"]
    r.hset(b"h\x00", b"f\x00", b"v\x00")
    assert r.hgetall(b"h\x00") == {b"f\x00": b"v\x00"}
    r.sadd(b"s", b"\x00\xff")
    assert r.smembers(b"s") == {b"\x00\xff"}
    assert r.get(b"") is None
    assert r.set(b"", b"") and r.get(b"") == b""


def test_keys_glob(r, raw):
    for k in ["hello", "hallo", "hxllo", "hllo", "heeeello", "hbllo", "h*llo", "h[llo", "x"]:
        r.set(k, 1)
    assert set(r.keys("h?llo")) == {b"hello", b"hallo", b"hxllo", b"hbllo", b"h*llo", b"h[llo"}
    assert set(r.keys("h*llo")) == {b"hello", b"hallo", b"hxllo", b"hllo", b"heeeello", b"hbllo", b"h*llo", b"h[llo"}
    assert set(r.keys("h[ae]llo")) == {b"hello", b"hallo"}
    assert set(r.keys("h[^e]llo")) == {b"hallo", b"hxllo", b"hbllo", b"h*llo", b"h[llo"}
    assert set(r.keys("h[a-b]llo")) == {b"hallo", b"hbllo"}
    assert set(r.keys("h[b-a]llo")) == {b"hallo", b"hbllo"}
    assert set(r.keys("h\\*llo")) == {b"h*llo"}
    assert set(r.keys("h[\\[]llo")) == {b"h[llo"}
    assert set(r.keys("h[llo")) == set()
    assert set(r.keys("*")) == {b"hello", b"hallo", b"hxllo", b"hllo", b"heeeello", b"hbllo", b"h*llo", b"h[llo", b"x"}
    assert r.keys("nomatch*") == []
    assert raw.call("KEYS", "x") == b"*1\r\n$1\r\nx\r\n"
    assert raw.call("KEYS") == arity("keys")


def test_keys_skips_expired(r):
    r.set("live", 1)
    r.set("dying", 1, px=1)
    time.sleep(0.01)
    assert r.keys("*") == [b"live"]


def test_scan(r, raw):
    names = {("key:%d" % i).encode() for i in range(300)}
    for n in names:
        r.set(n, 1)
    r.rpush("alist", "x")
    seen = []
    cursor = 0
    while True:
        cursor, batch = r.scan(cursor=cursor, count=25)
        seen.extend(batch)
        if cursor == 0:
            break
    assert set(seen) == names | {b"alist"}
    assert set(r.scan_iter(match="key:1?")) == {("key:1%d" % i).encode() for i in range(10)}
    assert list(r.scan_iter(_type="list")) == [b"alist"]
    assert list(r.scan_iter(match="nomatch*")) == []
    assert raw.call("SCAN", "abc") == b"-ERR invalid cursor\r\n"
    assert raw.call("SCAN", "18446744073709551616") == b"-ERR invalid cursor\r\n"
    assert raw.call("SCAN", "0", "COUNT", "0") == SYNTAX
    assert raw.call("SCAN", "0", "COUNT", "abc") == NOT_INTEGER
    assert raw.call("SCAN", "0", "foo") == SYNTAX
    assert raw.call("SCAN", "0", "MATCH") == SYNTAX
    assert raw.call("SCAN") == arity("scan")
    reply = raw.call("SCAN", "0", "MATCH", "alist", "COUNT", "1000")
    assert reply.endswith(b"*1\r\n$5\r\nalist\r\n")


def test_scan_stable_under_mutation(r):
    base = {("stable:%d" % i).encode() for i in range(500)}
    for n in base:
        r.set(n, 1)
    seen = []
    cursor = 0
    added = 0
    while True:
        cursor, batch = r.scan(cursor=cursor, count=20)
        seen.extend(batch)
        for _ in range(5):
            r.set("churn:%d" % added, 1)
            r.delete("churn:%d" % (added - 3))
            added += 1
        if cursor == 0:
            break
    assert base <= set(seen)


def test_expire_ttl_persist(r, raw):
    r.set("k", "v")
    assert r.ttl("k") == -1 and r.pttl("k") == -1
    assert r.ttl("none") == -2 and r.pttl("none") == -2
    assert r.expire("k", 100) is True
    assert 99 <= r.ttl("k") <= 100
    assert 99000 < r.pttl("k") <= 100000
    assert r.pexpire("k", 50000) is True
    assert 49 <= r.ttl("k") <= 50
    assert r.persist("k") is True
    assert r.persist("k") is False
    assert r.persist("none") is False
    assert r.ttl("k") == -1
    assert r.expire("none", 10) is False
    assert raw.call("EXPIRE", "k", "0") == b":1\r\n"  # in the past: deleted
    assert r.exists("k") == 0
    r.set("k", "v")
    assert raw.call("PEXPIRE", "k", "-5") == b":1\r\n"
    assert r.exists("k") == 0
    r.set("gone", "v", px=5)
    time.sleep(0.02)
    assert r.get("gone") is None and r.ttl("gone") == -2


def test_expire_options(r, raw):
    r.set("k", "v")
    assert raw.call("EXPIRE", "k", "100", "XX") == b":0\r\n"
    assert raw.call("EXPIRE", "k", "100", "GT") == b":0\r\n"  # no TTL counts as infinite
    assert raw.call("EXPIRE", "k", "100", "NX") == b":1\r\n"
    assert raw.call("EXPIRE", "k", "200", "NX") == b":0\r\n"
    assert raw.call("EXPIRE", "k", "200", "xx") == b":1\r\n"
    assert raw.call("EXPIRE", "k", "100", "GT") == b":0\r\n"
    assert raw.call("EXPIRE", "k", "300", "GT") == b":1\r\n"
    assert raw.call("EXPIRE", "k", "400", "LT") == b":0\r\n"
    assert raw.call("EXPIRE", "k", "50", "LT") == b":1\r\n"
    assert 49 <= r.ttl("k") <= 50
    r.set("p", "v")
    assert raw.call("PEXPIRE", "p", "5000", "LT") == b":1\r\n"
    assert raw.call("EXPIRE", "k", "10", "NX", "XX") == (
        b"-ERR NX and XX, GT or LT options at the same time are not compatible\r\n")
    assert raw.call("EXPIRE", "k", "10", "NX", "GT") == (
        b"-ERR NX and XX, GT or LT options at the same time are not compatible\r\n")
    assert raw.call("EXPIRE", "k", "10", "GT", "LT") == (
        b"-ERR GT and LT options at the same time are not compatible\r\n")
    assert raw.call("EXPIRE", "k", "10", "foo") == b"-ERR Unsupported option foo\r\n"
    assert raw.call("EXPIRE", "k", "abc") == NOT_INTEGER
    assert raw.call("EXPIRE", "k", "9223372036854775807") == b"-ERR invalid expire time in 'expire' command\r\n"
    assert raw.call("PEXPIRE", "k", "9223372036854775807") == (
        b"-ERR invalid expire time in 'pexpire' command\r\n")
    assert raw.call("EXPIRE", "k") == arity("expire")
    assert raw.call("TTL") == arity("ttl")
    assert raw.call("PTTL", "a", "b") == arity("pttl")
    assert raw.call("PERSIST") == arity("persist")


def test_overwrite_clears_ttl(r):
    r.set("k", "v", ex=100)
    r.set("k", "w")
    assert r.ttl("k") == -1
    r.set("k", "v", ex=100)
    r.set("k", "w", keepttl=True)
    assert r.ttl("k") > 0
    r.getset("k", "x")
    assert r.ttl("k") == -1
    r.set("k", "5", ex=100)
    r.incr("k")
    assert r.ttl("k") > 0  # INCR keeps it
    r.expire("k", 100)
    r.append("k", "0")
    assert r.ttl("k") > 0


# --- Strings ------------------------------------------------------------------------------


def test_set_get_options(r, raw):
    assert r.set("k", "v") is True
    assert r.get("k") == b"v"
    assert r.get("missing") is None
    assert raw.call("GET", "missing") == b"$-1\r\n"
    assert r.set("k", "w", nx=True) is None
    assert raw.call("SET", "k", "w", "NX") == b"$-1\r\n"
    assert r.set("new", "w", xx=True) is None
    assert r.set("k", "w", xx=True) is True and r.get("k") == b"w"
    assert r.set("n", "1", nx=True) is True
    assert raw.call("SET", "k", "x", "GET") == b"$1\r\nw\r\n"
    assert raw.call("SET", "fresh", "x", "GET") == b"$-1\r\n"
    assert raw.call("SET", "k", "y", "NX", "GET") == b"$1\r\nx\r\n"
    assert r.get("k") == b"x"
    assert r.set("e", "v", ex=100) and 99 <= r.ttl("e") <= 100
    assert r.set("e", "v", px=100000) and 99000 < r.pttl("e") <= 100000
    at = int(time.time()) + 100
    assert r.set("e", "v", exat=at) and 98 <= r.ttl("e") <= 100
    assert r.set("e", "v", pxat=at * 1000) and 98 <= r.ttl("e") <= 100
    assert raw.call("SET", "e", "v", "EX", "10", "EX", "20") == b"+OK\r\n"
    r.rpush("list", "a")
    assert raw.call("SET", "list", "v", "GET") == WRONGTYPE
    assert r.type("list") == b"list"
    assert raw.call("SET", "list", "v") == b"+OK\r\n"  # SET replaces any type
    assert r.get("list") == b"v"


def test_set_errors(raw):
    assert raw.call("SET", "k") == arity("set")
    assert raw.call("SET", "k", "v", "EX", "0") == b"-ERR invalid expire time in 'set' command\r\n"
    assert raw.call("SET", "k", "v", "EX", "-5") == b"-ERR invalid expire time in 'set' command\r\n"
    assert raw.call("SET", "k", "v", "PX", "0") == b"-ERR invalid expire time in 'set' command\r\n"
    assert raw.call("SET", "k", "v", "EX", "abc") == NOT_INTEGER
    assert raw.call("SET", "k", "v", "EX", "9223372036854775") == b"-ERR invalid expire time in 'set' command\r\n"
    assert raw.call("SET", "k", "v", "EXAT", "99999999999999999") == (
        b"-ERR invalid expire time in 'set' command\r\n")
    assert raw.call("SET", "k", "v", "NX", "XX") == SYNTAX
    assert raw.call("SET", "k", "v", "KEEPTTL", "EX", "10") == SYNTAX
    assert raw.call("SET", "k", "v", "EX", "10", "PX", "10") == SYNTAX
    assert raw.call("SET", "k", "v", "EX") == SYNTAX
    assert raw.call("SET", "k", "v", "foo") == SYNTAX
    assert raw.call("GET", "missing") == b"$-1\r\n"  # nothing was set
    assert raw.call("GET") == arity("get")
    assert raw.call("GET", "a", "b") == arity("get")


def test_getset_mset_mget(r, raw):
    assert r.getset("k", "1") is None
    assert r.getset("k", "2") == b"1"
    assert raw.call("GETSET", "k") == arity("getset")
    assert r.mset({"a": "1", "b": "2"}) is True
    assert r.mget("a", "b", "nope") == [b"1", b"2", None]
    r.rpush("l", "x")
    assert r.mget("a", "l") == [b"1", None]
    assert raw.call("GETSET", "l", "v") == WRONGTYPE
    assert raw.call("MSET", "a") == arity("mset")
    assert raw.call("MSET", "a", "b", "c") == arity("mset")
    assert raw.call("MGET") == arity("mget")
    assert raw.call("MSET", "x", "1", "x", "2") == b"+OK\r\n"
    assert r.get("x") == b"2"


def test_incr_family(r, raw):
    assert r.incr("n") == 1
    assert r.incrby("n", 10) == 11
    assert r.decr("n") == 10
    assert r.decrby("n", 20) == -10
    assert r.get("n") == b"-10"
    assert raw.call("INCRBY", "n", "-5") == b":-15\r\n"
    r.set("big", "9223372036854775807")
    assert raw.call("INCR", "big") == b"-ERR increment or decrement would overflow\r\n"
    r.set("small", "-9223372036854775808")
    assert raw.call("DECR", "small") == b"-ERR increment or decrement would overflow\r\n"
    assert raw.call("DECRBY", "small", "-9223372036854775808") == b"-ERR decrement would overflow\r\n"
    assert raw.call("INCRBY", "n", "abc") == NOT_INTEGER
    assert raw.call("INCRBY", "n", "1.5") == NOT_INTEGER
    for bad in [" 1", "010", "+1", "1 ", "abc", "", "99999999999999999999"]:
        r.set("s", bad)
        assert raw.call("INCR", "s") == NOT_INTEGER, bad
    r.set("s", "-0")
    assert raw.call("INCR", "s") == NOT_INTEGER
    r.rpush("l", "x")
    assert raw.call("INCR", "l") == WRONGTYPE
    assert raw.call("DECRBY", "l", "1") == WRONGTYPE
    assert raw.call("INCRBY", "l", "x") == NOT_INTEGER  # the increment is read first
    assert raw.call("INCR") == arity("incr")
    assert raw.call("INCRBY", "n") == arity("incrby")
    assert raw.call("DECR", "a", "b") == arity("decr")
    assert raw.call("DECRBY", "n") == arity("decrby")


def test_append_strlen(r, raw):
    assert r.append("k", "ab") == 2
    assert r.append("k", "\x00c") == 4
    assert r.get("k") == b"ab\x00c"
    assert r.strlen("k") == 4
    assert r.strlen("none") == 0
    r.set("n", 12)
    assert r.append("n", "3") == 3 and r.incr("n") == 124
    r.rpush("l", "x")
    assert raw.call("APPEND", "l", "x") == WRONGTYPE
    assert raw.call("STRLEN", "l") == WRONGTYPE
    assert raw.call("APPEND", "k") == arity("append")
    assert raw.call("STRLEN") == arity("strlen")


# --- Lists --------------------------------------------------------------------------------


def test_push_pop(r, raw):
    assert r.lpush("l", "a", "b") == 2
    assert r.rpush("l", "c", "d") == 4
    assert r.lrange("l", 0, -1) == [b"b", b"a", b"c", b"d"]
    assert r.llen("l") == 4
    assert r.lpop("l") == b"b"
    assert r.rpop("l") == b"d"
    assert r.lpop("l", 5) == [b"a", b"c"]
    assert r.exists("l") == 0  # emptied lists are deleted
    assert r.lpop("l") is None
    assert raw.call("LPOP", "nokey", "2") == b"*-1\r\n"
    assert raw.call("LPOP", "nokey", "0") == b"*-1\r\n"
    assert raw.call("RPOP", "nokey") == b"$-1\r\n"
    r.rpush("l", "1", "2", "3")
    assert raw.call("RPOP", "l", "2") == b"*2\r\n$1\r\n3\r\n$1\r\n2\r\n"
    assert raw.call("LPOP", "l", "0") == b"*0\r\n"
    assert raw.call("LPOP", "l", "-1") == b"-ERR value is out of range, must be positive\r\n"
    assert raw.call("RPOP", "l", "abc") == b"-ERR value is out of range, must be positive\r\n"
    assert raw.call("LPOP", "l", "1", "2") == arity("lpop")
    assert raw.call("LPUSH", "l") == arity("lpush")
    assert raw.call("RPUSH", "l") == arity("rpush")
    assert raw.call("LPOP") == arity("lpop")
    r.set("s", "v")
    assert raw.call("LPUSH", "s", "x") == WRONGTYPE
    assert raw.call("RPUSH", "s", "x") == WRONGTYPE
    assert raw.call("LPOP", "s") == WRONGTYPE
    assert raw.call("RPOP", "s", "1") == WRONGTYPE
    assert raw.call("LLEN", "s") == WRONGTYPE
    assert r.llen("none") == 0


def test_lrange_lindex(r, raw):
    r.rpush("l", *[str(i) for i in range(10)])
    assert r.lrange("l", 0, 2) == [b"0", b"1", b"2"]
    assert r.lrange("l", -3, -1) == [b"7", b"8", b"9"]
    assert r.lrange("l", -100, 1) == [b"0", b"1"]
    assert r.lrange("l", 8, 100) == [b"8", b"9"]
    assert r.lrange("l", 5, 2) == []
    assert r.lrange("l", 10, 20) == []
    assert r.lrange("none", 0, -1) == []
    assert r.lindex("l", 0) == b"0"
    assert r.lindex("l", -1) == b"9"
    assert r.lindex("l", 10) is None
    assert r.lindex("none", 0) is None
    assert raw.call("LRANGE", "l", "a", "b") == NOT_INTEGER
    assert raw.call("LINDEX", "l", "x") == NOT_INTEGER
    assert raw.call("LINDEX", "none", "x") == b"$-1\r\n"  # the key is looked up first
    assert raw.call("LRANGE", "l", "0") == arity("lrange")
    assert raw.call("LINDEX", "l") == arity("lindex")
    r.set("s", "v")
    assert raw.call("LRANGE", "s", "0", "1") == WRONGTYPE
    assert raw.call("LINDEX", "s", "0") == WRONGTYPE


def test_large_list(r):
    values = [("v%d" % i).encode() for i in range(5000)]
    for i in range(0, 5000, 500):
        r.rpush("big", *values[i:i + 500])
    assert r.llen("big") == 5000
    assert r.lrange("big", 0, -1) == values
    assert r.lrange("big", 100, 2099) == values[100:2100]
    assert r.delete("big") == 1
    assert r.rpush("big", "fresh") == 1
    assert r.lrange("big", 0, -1) == [b"fresh"]


# --- Hashes -------------------------------------------------------------------------------


def test_hashes(r, raw):
    assert r.hset("h", mapping={"a": "1", "b": "2"}) == 2
    assert r.hset("h", mapping={"a": "3", "c": "4"}) == 1
    assert r.hget("h", "a") == b"3"
    assert r.hget("h", "zz") is None
    assert r.hget("none", "a") is None
    assert r.hgetall("h") == {b"a": b"3", b"b": b"2", b"c": b"4"}
    assert r.hgetall("none") == {}
    assert r.hlen("h") == 3 and r.hlen("none") == 0
    assert r.hexists("h", "a") and not r.hexists("h", "zz") and not r.hexists("none", "a")
    assert r.hdel("h", "a", "zz", "a") == 1
    assert r.hdel("none", "a") == 0
    assert r.hincrby("h", "n", 5) == 5
    assert r.hincrby("h", "n", -7) == -2
    assert r.hincrby("newhash", "n", 3) == 3
    r.hset("h", "big", "9223372036854775807")
    assert raw.call("HINCRBY", "h", "big", "1") == b"-ERR increment or decrement would overflow\r\n"
    assert raw.call("HINCRBY", "h", "c", "x") == NOT_INTEGER
    r.hset("h", "text", "abc")
    assert raw.call("HINCRBY", "h", "text", "1") == b"-ERR hash value is not an integer\r\n"
    assert r.hdel("h", "b", "c", "n", "big", "text") == 5
    assert r.exists("h") == 0  # emptied hashes are deleted
    assert raw.call("HSET", "h") == arity("hset")
    assert raw.call("HSET", "h", "f") == arity("hset")
    assert raw.call("HSET", "h", "f", "v", "x") == arity("hset")
    assert raw.call("HGET", "h") == arity("hget")
    assert raw.call("HDEL", "h") == arity("hdel")
    assert raw.call("HGETALL") == arity("hgetall")
    assert raw.call("HLEN") == arity("hlen")
    assert raw.call("HEXISTS", "h") == arity("hexists")
    assert raw.call("HINCRBY", "h", "f") == arity("hincrby")
    r.set("s", "v")
    for args in [("HSET", "s", "f", "v"), ("HGET", "s", "f"), ("HDEL", "s", "f"), ("HGETALL", "s"),
                 ("HLEN", "s"), ("HEXISTS", "s", "f"), ("HINCRBY", "s", "f", "1")]:
        assert raw.call(*args) == WRONGTYPE, args
    assert raw.call("HSET", "h2", "f", "v") == b":1\r\n"
    assert raw.call("HGETALL", "h2") == b"*2\r\n$1\r\nf\r\n$1\r\nv\r\n"


# --- Sets ---------------------------------------------------------------------------------


def test_sets(r, raw):
    assert r.sadd("s", "a", "b", "a") == 2
    assert r.sadd("s", "b", "c") == 1
    assert r.smembers("s") == {b"a", b"b", b"c"}
    assert r.smembers("none") == set()
    assert raw.call("SMEMBERS", "none") == b"*0\r\n"
    assert r.sismember("s", "a") == 1 and r.sismember("s", "z") == 0
    assert r.sismember("none", "a") == 0
    assert r.scard("s") == 3 and r.scard("none") == 0
    assert r.srem("s", "a", "z") == 1
    assert r.srem("none", "a") == 0
    popped = r.spop("s")
    assert popped in {b"b", b"c"}
    assert r.spop("s", 5) == [({b"b", b"c"} - {popped}).pop()]
    assert r.exists("s") == 0  # emptied sets are deleted
    assert r.spop("s") is None
    assert raw.call("SPOP", "none", "2") == b"*0\r\n"
    assert raw.call("SPOP", "none", "0") == b"*0\r\n"
    r.sadd("s", "a", "b", "c", "d")
    assert len(r.spop("s", 2)) == 2 and r.scard("s") == 2
    assert raw.call("SPOP", "s", "0") == b"*0\r\n"
    assert raw.call("SPOP", "s", "-1") == b"-ERR value is out of range, must be positive\r\n"
    assert raw.call("SPOP", "s", "1", "2") == SYNTAX
    assert raw.call("SADD", "s") == arity("sadd")
    assert raw.call("SREM", "s") == arity("srem")
    assert raw.call("SMEMBERS") == arity("smembers")
    assert raw.call("SISMEMBER", "s") == arity("sismember")
    assert raw.call("SCARD") == arity("scard")
    assert raw.call("SPOP") == arity("spop")
    r.set("str", "v")
    for args in [("SADD", "str", "m"), ("SREM", "str", "m"), ("SMEMBERS", "str"), ("SISMEMBER", "str", "m"),
                 ("SCARD", "str"), ("SPOP", "str"), ("SPOP", "str", "1")]:
        assert raw.call(*args) == WRONGTYPE, args


def test_wrongtype_on_strings(r, raw):
    r.sadd("set", "m")
    assert raw.call("GET", "set") == WRONGTYPE
    assert raw.call("APPEND", "set", "x") == WRONGTYPE


# --- The protocol over a raw socket ----------------------------------------------------------


def protocol_error(raw, data, message):
    raw.send(data)
    assert raw.read_reply_bytes() == b"-ERR Protocol error: " + message + b"\r\n"
    assert raw.closed_by_server()


def test_inline_commands(r, raw):
    raw.send(b"PING\r\n")
    assert raw.read_reply_bytes() == b"+PONG\r\n"
    raw.send(b"SET  inline   \"a b\\x41\\n\"  \r\n")
    assert raw.read_reply_bytes() == b"+OK\r\n"
    assert r.get("inline") == b"a bA\n"
    raw.send(b"SET q 'it\\'s'\nGET q\n")
    assert raw.read_reply_bytes() == b"+OK\r\n"
    assert raw.read_reply_bytes() == b"$4\r\nit's\r\n"
    raw.send(b"\r\n\n  \r\nECHO \"\"\r\n")
    assert raw.read_reply_bytes() == b"$0\r\n\r\n"
    raw.send(b"ECHO \"\\t\\r\\\\\"\r\n")
    assert raw.read_reply_bytes() == b"$3\r\n\t\r\\\r\n"


def test_unbalanced_quotes(raw):
    protocol_error(raw, b"ECHO \"abc\r\n", b"unbalanced quotes in request")


def test_closing_quote_must_end_argument(raw):
    protocol_error(raw, b"ECHO 'a'b\r\n", b"unbalanced quotes in request")


def test_bulk_length_limits(raw):
    protocol_error(raw, b"*1\r\n$4294967296\r\n", b"invalid bulk length")


def test_bulk_length_just_over_default_limit(raw):
    protocol_error(raw, b"*1\r\n$536870913\r\n", b"invalid bulk length")


def test_negative_bulk_length(raw):
    protocol_error(raw, b"*1\r\n$-1\r\n", b"invalid bulk length")


def test_bad_bulk_length(raw):
    protocol_error(raw, b"*1\r\n$04\r\nPING\r\n", b"invalid bulk length")


def test_multibulk_count_limits(raw):
    protocol_error(raw, b"*2147483648\r\n", b"invalid multibulk length")


def test_bad_multibulk_count(raw):
    protocol_error(raw, b"*1x\r\n", b"invalid multibulk length")


def test_expected_dollar(raw):
    protocol_error(raw, b"*1\r\n:4\r\n", b"expected '$', got ':'")


def test_too_big_inline(raw):
    protocol_error(raw, b"A" * (70 * 1024), b"too big inline request")


def test_too_big_mbulk_count(raw):
    protocol_error(raw, b"*" + b"1" * (70 * 1024), b"too big mbulk count string")


def test_replies_before_a_protocol_error_arrive(raw):
    raw.send(b"PING\r\n*1\r\n$4\r\nPING\r\n*1\r\n!4\r\n")
    assert raw.read_reply_bytes() == b"+PONG\r\n"
    assert raw.read_reply_bytes() == b"+PONG\r\n"
    assert raw.read_reply_bytes() == b"-ERR Protocol error: expected '$', got '!'\r\n"
    assert raw.closed_by_server()


def test_empty_and_negative_multibulk_are_skipped(raw):
    raw.send(b"*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n")
    assert raw.read_reply_bytes() == b"+PONG\r\n"


def test_declared_4gb_bulk_is_refused_before_any_data(raw):
    protocol_error(raw, b"*2\r\n$3\r\nSET\r\n$4294967296\r\n", b"invalid bulk length")


def test_one_byte_at_a_time(r, raw):
    data = Raw.encode("SET", "slow", "v\r\nalue") + b"GET slow\r\n" + Raw.encode("ECHO", "")
    for i in range(len(data)):
        raw.send(data[i:i + 1])
    assert raw.read_reply_bytes() == b"+OK\r\n"
    assert raw.read_reply_bytes() == b"$7\r\nv\r\nalue\r\n"
    assert raw.read_reply_bytes() == b"$0\r\n\r\n"


def test_pipelined_100000_pings(raw):
    raw.send(b"*1\r\n$4\r\nPING\r\n" * 100000)
    expected = b"+PONG\r\n" * 100000
    got = raw.read_exact(len(expected))
    assert got == expected


def test_pipelined_mixed_commands(r, raw):
    batch = b"".join(Raw.encode("INCR", "counter") for _ in range(1000))
    raw.send(batch + Raw.encode("GET", "counter"))
    for i in range(1, 1001):
        assert raw.read_reply_bytes() == b":%d\r\n" % i
    assert raw.read_reply_bytes() == b"$4\r\n1000\r\n"


def test_large_value_round_trip(r):
    value = os.urandom(3 * 1024 * 1024)
    assert r.set("blob", value)
    assert r.get("blob") == value
    assert r.strlen("blob") == len(value)
