// leafd through ioredis and node-redis: their connect handshakes, INCR/INCRBY/SNOWFLAKE, a
// pipeline or auto-pipelined batch of 1,000, and RESP3 for node-redis. Every ID must be unique.
// Usage: node node_clients.mjs PORT
import assert from "node:assert/strict";
import Redis from "ioredis";
import { createClient } from "redis";

const port = Number(process.argv[2]);
// Snowflake IDs exceed 2^53, which a JavaScript number cannot hold exactly: integer replies
// are checked for type only, and uniqueness is checked on GET snowflake, which is a string.
const seen = new Set();
function unique(ids, what) {
  for (const id of ids) {
    assert.ok(typeof id === "string" || Number.isSafeInteger(id), `${what}: ${id} is not exact`);
    const n = BigInt(id);
    assert.ok(!seen.has(n), `${what}: duplicate ${n}`);
    seen.add(n);
  }
}
function isInteger(value, what) {
  assert.equal(typeof value, "number", `${what}: ${value}`);
}

// ioredis: ready check (INFO), explicit pipeline and auto-pipelining.
const io = new Redis({ host: "127.0.0.1", port, enableAutoPipelining: true, lazyConnect: true });
await io.connect();
assert.equal(await io.call("LEAF.TAG", "CREATE", "node", "100"), "OK");
assert.equal(await io.incr("segment:node"), 1);
assert.equal(await io.incrby("segment:node", 10), 11);
unique(Array.from({ length: 11 }, (_, i) => i + 1), "ioredis incr/incrby");
isInteger(await io.call("SNOWFLAKE"), "ioredis SNOWFLAKE");
isInteger(await io.incr("snowflake"), "ioredis INCR snowflake");
unique(await Promise.all(Array.from({ length: 200 }, () => io.get("snowflake"))), "ioredis GET snowflake");
const pipeline = io.pipeline();
for (let i = 0; i < 1000; i++) pipeline.incr("segment:node");
const piped = (await pipeline.exec()).map(([err, id]) => {
  assert.equal(err, null);
  return id;
});
unique(piped, "ioredis pipeline");
const txReplies = await io.multi().incr("segment:node").incr("segment:node").exec();
unique(txReplies.map(([err, id]) => {
  assert.equal(err, null);
  return id;
}), "ioredis multi/exec");
const auto = await Promise.all(Array.from({ length: 1000 }, () => io.incr("segment:node")));
unique(auto, "ioredis auto-pipelining");
await io.quit();

// node-redis v5: HELLO, CLIENT SETINFO, SELECT on connect; RESP3 too.
for (const RESP of [2, 3]) {
  const client = createClient({ url: `redis://127.0.0.1:${port}/0`, RESP });
  client.on("error", (e) => {
    throw e;
  });
  await client.connect();
  unique([await client.incr("segment:node")], `node-redis RESP${RESP}`);
  isInteger(await client.sendCommand(["SNOWFLAKE"]), `node-redis RESP${RESP} SNOWFLAKE`);
  unique(await Promise.all(Array.from({ length: 200 }, () => client.get("snowflake"))), `node-redis RESP${RESP} GET snowflake`);
  const multi = client.multi();
  for (let i = 0; i < 1000; i++) multi.incr("segment:node");
  unique(await multi.execAsPipeline(), `node-redis RESP${RESP} pipeline`);
  // multi().exec() is a real transaction: MULTI … EXEC.
  const tx = client.multi();
  for (let i = 0; i < 100; i++) tx.incr("segment:node");
  unique(await tx.exec(), `node-redis RESP${RESP} MULTI/EXEC`);
  const batch = await client.sendCommand(["SNOWFLAKE", "20"]);
  assert.equal(batch.length, 20);
  batch.forEach((id) => isInteger(id, `node-redis RESP${RESP} SNOWFLAKE 20`));
  await client.quit();
}
console.log(`ioredis and node-redis: ${seen.size} unique IDs`);
