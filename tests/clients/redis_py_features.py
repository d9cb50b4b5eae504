"""leafd's ID features through redis-py and HTTP, on a node run.sh starts with them configured:
the JavaScript-safe snowflake layout (41 + 4 + 8 bits in 10 ms steps), tags created on first use
(pattern auto-*), id_delta 2 / id_remainder 1 (this "data centre" hands out odd IDs), and an
opaque tag under the same split. Every ID must be unique.
Usage: redis_py_features.py RESP_PORT HTTP_PORT"""
import sys
import urllib.request

import redis

port, http_port = int(sys.argv[1]), int(sys.argv[2])
r = redis.Redis(host="127.0.0.1", port=port)
EPOCH_MS, MAX_SAFE = 1288834974657, (1 << 53) - 1


def http(path):
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}{path}", timeout=10) as reply:
        return int(reply.read())


# JavaScript-safe snowflake IDs: increasing, at most 2^53 - 1, over RESP and HTTP.
snowflakes = []
for _ in range(20):
    snowflakes += r.execute_command("SNOWFLAKE", 100)
snowflakes.append(http("/api/snowflake/get/any"))
assert all(0 < i <= MAX_SAFE for i in snowflakes), max(snowflakes)
assert all(a < b for a, b in zip(snowflakes, snowflakes[1:])), "snowflake IDs increase"
decoded = r.execute_command("LEAF.DECODE", snowflakes[-1])
if not isinstance(decoded, dict):
    decoded = dict(zip(decoded[::2], decoded[1::2]))
stamp = int(decoded.get(b"timestamp_ms", decoded.get("timestamp_ms")))
assert (stamp - EPOCH_MS) % 10 == 0, f"{stamp} is not the start of a 10 ms step"
assert r.execute_command("LEAF.FROMTIME", stamp) <= snowflakes[-1] < r.execute_command("LEAF.FROMTIME", stamp + 10)

# A tag created by its first use, handing out only odd IDs (delta 2, remainder 1).
first = r.incr("segment:auto-orders")
assert first == 1, first
pipe = r.pipeline(transaction=False)
for _ in range(500):
    pipe.incr("segment:auto-orders")
ids = [first] + pipe.execute()
block_last = r.incrby("segment:auto-orders", 5)
ids += [block_last - 2 * k for k in range(4, -1, -1)]
ids.append(http("/api/segment/get/auto-orders"))
assert all(i % 2 == 1 for i in ids), [i for i in ids if i % 2 != 1][:5]
assert all(a < b for a, b in zip(ids, ids[1:])), "segment IDs increase"
try:
    r.incr("segment:not-auto")
    raise AssertionError("a tag outside auto_create_pattern must stay unknown")
except redis.ResponseError as e:
    assert "unknown tag" in str(e), e

# Opaque IDs under the same split: 9 digits, distinct, each the permutation of an odd ID.
pipe = r.pipeline(transaction=False)
for _ in range(300):
    pipe.incr("segment:auto-opaque")
opaque = pipe.execute()
assert all(100_000_000 <= i <= 999_999_999 for i in opaque), opaque[:3]
assert len(set(opaque)) == len(opaque)
revealed = [r.execute_command("LEAF.TAG", "REVEAL", "auto-opaque", i) for i in opaque]
assert revealed == list(range(1, 600, 2)), revealed[:5]

print(f"redis-py features: {len(snowflakes)} JavaScript-safe snowflake IDs, {len(ids)} odd IDs of a "
      f"tag created on first use, {len(opaque)} opaque IDs of odd positions")
