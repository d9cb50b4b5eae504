"""leafd through redis-py: incr, incrby, SNOWFLAKE, a pipeline of 1,000, RESP3, and a
connection pool under 8 threads. Every ID must be unique. Usage: redis_py_client.py PORT"""
import sys
import threading

import redis

port = int(sys.argv[1])
seen = set()


def unique(ids, what):
    for i in ids:
        assert isinstance(i, int), f"{what}: {i!r} is not an integer"
        assert i not in seen, f"{what}: duplicate {i}"
        seen.add(i)


r = redis.Redis(host="127.0.0.1", port=port)
assert r.ping() is True
assert r.execute_command("LEAF.TAG", "CREATE", "py", 100) in (b"OK", "OK")
first = r.incr("segment:py")
assert first == 1, first
last = r.incrby("segment:py", 10)
assert last == 11, last
unique([first] + list(range(2, 12)), "incr/incrby")
unique([r.execute_command("SNOWFLAKE"), r.incr("snowflake")], "snowflake")
batch = r.execute_command("SNOWFLAKE", 50)
assert batch == sorted(batch) and len(batch) == 50, batch
unique(batch, "SNOWFLAKE 50")

pipe = r.pipeline(transaction=False)
for _ in range(1000):
    pipe.incr("segment:py")
ids = pipe.execute()
assert ids == sorted(ids), "pipeline replies in order"
unique(ids, "pipeline")

# redis-py's default pipeline is a transaction: MULTI … EXEC.
tx = r.pipeline()
for _ in range(100):
    tx.incr("segment:py")
tx.execute_command("SNOWFLAKE")
replies = tx.execute()
assert all(isinstance(i, int) for i in replies), replies
unique(replies, "pipeline() (MULTI/EXEC)")

r3 = redis.Redis(host="127.0.0.1", port=port, protocol=3)
unique([r3.incr("segment:py"), r3.execute_command("SNOWFLAKE")], "resp3")
hello = r3.execute_command("HELLO", 3)
assert hello.get(b"proto", hello.get("proto")) == 3, hello

pool = redis.ConnectionPool(host="127.0.0.1", port=port, max_connections=8)
results = [[] for _ in range(8)]


def worker(n):
    client = redis.Redis(connection_pool=pool)
    for _ in range(500):
        results[n].append(client.incr("segment:py"))
        results[n].append(client.execute_command("SNOWFLAKE"))


threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for ids in results:
    unique(ids, "pool")
# LEAF.FROMTIME: the smallest ID of an instant. Every ID issued at or after t is >= it, every
# one issued before t is below it (checked on IDs really issued either side of t).
import time
issued = []
deadline = time.monotonic() + 0.03
while time.monotonic() < deadline:
    issued += r.execute_command("SNOWFLAKE", 200)
pipe = r.pipeline(transaction=False)
for i in issued:
    pipe.execute_command("LEAF.DECODE", i)
times = pipe.execute()
def field(reply, name):
    if isinstance(reply, dict):
        return reply.get(name.encode(), reply.get(name))
    pairs = dict(zip(reply[::2], reply[1::2]))
    return pairs.get(name.encode(), pairs.get(name))
stamps = [field(t, "timestamp_ms") for t in times]
boundaries = sorted(set(stamps))[1:]
assert len(boundaries) >= 3, f"30 ms of SNOWFLAKE spanned {len(boundaries) + 1} milliseconds"
for t in boundaries:
    first = r.execute_command("LEAF.FROMTIME", t)
    before = [i for i, s in zip(issued, stamps) if s < t]
    after = [i for i, s in zip(issued, stamps) if s >= t]
    assert max(before) < first <= min(after), (t, first, max(before), min(after))
try:
    r.execute_command("LEAF.FROMTIME", "1000")
    raise AssertionError("a time before the epoch must be refused")
except redis.ResponseError as e:
    assert "before the snowflake epoch" in str(e), e

# Opaque IDs (run.sh configures py-opaque with 8 digits): distinct 8-digit numbers whose order
# is not the sequence's, each revealed back to a distinct sequential ID; INCRBY is refused.
assert r.execute_command("LEAF.TAG", "CREATE", "py-opaque", 100) in (b"OK", "OK")
pipe = r.pipeline(transaction=False)
for _ in range(2000):
    pipe.incr("segment:py-opaque")
opaque = pipe.execute()
assert all(10_000_000 <= i <= 99_999_999 for i in opaque), opaque[:5]
assert len(set(opaque)) == len(opaque), "opaque IDs repeat"
rising = sum(1 for a, b in zip(opaque, opaque[1:]) if b > a)
assert 600 < rising < 1400, f"the order shows: {rising} of 1999 rise"
pipe = r.pipeline(transaction=False)
for i in opaque:
    pipe.execute_command("LEAF.TAG", "REVEAL", "py-opaque", i)
assert pipe.execute() == list(range(1, 2001)), "REVEAL gives back the sequence"
try:
    r.incrby("segment:py-opaque", 2)
    raise AssertionError("INCRBY on an opaque tag must be refused")
except redis.ResponseError as e:
    assert "hands out opaque IDs" in str(e), e
print(f"redis-py {redis.__version__}: {len(seen)} unique IDs, LEAF.FROMTIME checked at {len(boundaries)} instants, {len(opaque)} opaque IDs")
