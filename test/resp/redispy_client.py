"""redis-py against the sidecar's RESP listener (respstore's TestRedisPy).

Usage: redispy_client.py redis://user:pass@host:port/db

Runs Debian's python3-redis, sync and asyncio, and replays LMCache's
redis:// connector (lmcache/v1/storage_backend/connector/redis_connector.py)
call for call on redis.asyncio, as LMCache runs it: a ConnectionPool from
the URL, EXISTS <key>metadata for lookups, SET <key>kv_bytes then SET
<key>metadata for a store, GET <key>metadata then GET <key>kv_bytes for a
retrieve, DEL <key>metadata when the bytes are gone. Prints "redis-py ok"
at the end; any mismatch raises.
"""
import asyncio
import os
import struct
import sys

import redis
import redis.asyncio as aioredis

url = sys.argv[1]

# --- plain redis-py ---------------------------------------------------------
r = redis.Redis.from_url(url)
assert r.ping() is True
value = os.urandom(8 << 20)
assert r.set("chunk", value) is True
assert r.get("chunk") == value
assert r.get("missing") is None
assert r.exists("chunk", "missing") == 1
assert r.set("chunk", b"x", nx=True) is None
assert r.set("ttl", b"v", ex=60) is True
assert 55 <= r.ttl("ttl") <= 60
with r.pipeline(transaction=False) as p:
    for i in range(20):
        p.set(f"p{i}", str(i))
        p.get(f"p{i}")
    out = p.execute()
assert out[1::2] == [str(i).encode() for i in range(20)], out
assert r.delete("chunk", "missing") == 1
assert r.client_setname("lmcache-worker") is True
assert r.info("keyspace")["db0"]["keys"] >= 21
try:
    r.execute_command("LPUSH", "l", "a")
    raise AssertionError("LPUSH answered")
except redis.ResponseError as e:
    assert "unknown command" in str(e), e
assert r.ping() is True  # the connection survived the error

# --- LMCache's redis:// connector, call for call ----------------------------
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CHUNK = 256 * 2 * 32 * 8 * 128 * 2 // 16  # a small chunk: 256 KiB


def cache_engine_key(i, salt=None):
    s = f"{MODEL}@1@0@{i:016x}@bfloat16"
    if salt:
        s += f"@cache_salt%{salt}"
    return s


def remote_metadata(length):
    # RemoteMetadata: length, shape (4 dims), dtype, memory format: 28 bytes.
    return struct.pack("<iiiiiii", length, 2, 32, 256, 128, 3, 1)


async def lmcache_redis_connector():
    pool = aioredis.ConnectionPool.from_url(url, max_connections=150)
    conn = aioredis.Redis(connection_pool=pool)
    chunks = {cache_engine_key(i, salt="user-a" if i % 2 else None): os.urandom(CHUNK) for i in range(8)}

    async def put(key, kv):
        await conn.set(key + "kv_bytes", kv)
        await conn.set(key + "metadata", remote_metadata(len(kv)))

    async def get(key):
        meta = await conn.get(key + "metadata")
        if meta is None:
            return None
        length = struct.unpack("<i", meta[:4])[0]
        kv = await conn.get(key + "kv_bytes")
        if kv is None:
            await conn.delete(key + "metadata")
            return None
        assert len(kv) == length
        return kv

    async def contains(keys):
        n = 0
        for k in keys:
            if not await conn.exists(k + "metadata"):
                return n
            n += 1
        return n

    keys = list(chunks)
    assert await contains(keys) == 0
    await asyncio.gather(*(put(k, v) for k, v in chunks.items()))  # batched_put
    assert await contains(keys) == len(keys)
    got = await asyncio.gather(*(get(k) for k in keys))  # batched_get_non_blocking
    assert all(g == chunks[k] for g, k in zip(got, keys))
    # A chunk whose bytes are gone: the connector deletes its metadata.
    await conn.delete(keys[3] + "kv_bytes")
    assert await get(keys[3]) is None
    assert await conn.exists(keys[3] + "metadata") == 0
    assert await contains(keys) == 3
    await conn.close()
    await pool.disconnect()


asyncio.run(lmcache_redis_connector())
print("redis-py ok", redis.__version__)
